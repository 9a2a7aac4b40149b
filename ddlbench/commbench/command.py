"""`bench commbench launcher.nproc=N`: the machine's ceiling for each collective, on the backend and
ranks a run uses (gloo on CPU, NCCL on GPU), over message sizes.

Per kind and size: the op's time (each rank's median over `iters`, max over ranks, and beside it
the same of each rank's mean, `mean_time_s`; with `gap_ms=G`
every rank sleeps G ms after the barrier before each timed op, so the link has been idle as it is
between a training step's collectives: on `bench cluster`'s shaped links a message after idle
crosses at a different speed than back to back), algbw = bytes /
time and busbw = algbw x the nccl-tests factor (all-reduce 2(N-1)/N; all-gather, reduce-scatter
(N-1)/N; broadcast, reduce, p2p 1), where bytes is the full buffer (all-gather: the gathered size;
reduce-scatter: the input) as in nccl-tests and in the runs' comm records. On gloo each rank also
records the bytes it wrote to its sockets during one op (/proc/self/io), beside what the wire
factors of ddlbench/metrics/comm.py predict: the check that the run records' wire bytes are true.

Ranks are local processes (fork on CPU, spawn on CUDA), or, with `launcher=slurm`, the tasks of an
srun step (one process per task; across nodes: `srun -N2 bench commbench launcher=slurm`).

Across a cluster's two dimensions (`kinds=[all_reduce,all_reduce_node,all_reduce_cross,all_reduce_hier]`,
ranks grouped by host): the node's all-reduce, the cross-node one, and the hierarchical all-reduce
beside the flat ring, with an α-β fit per dimension (ddlbench/commbench/dims.py).

Per kind measured at two or more sizes, α and β are fitted in the network model's terms
(ddlbench.network.fit) and written with the record; `network=BASE` (a conf/network name or a path;
default: $DDLBENCH_NETWORK, set inside `bench cluster`) also writes <out>/network.yaml: BASE with
the dimension the ranks spanned priced by the all-reduce fit, for `bench project`/`bench advise`.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from ddlbench.comm import threads as commthreads
from ddlbench.commbench.dims import DIM_KINDS, dimension_fits, group_op, group_size, make_groups
from ddlbench.errors import ConfigError
from ddlbench.metrics.comm import bus_bandwidth, gloo_reduce_sent, wire_factor

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send")
DEFAULTS = {"nproc": 2, "sizes": None, "iters": 5, "warmup": 2, "gap_ms": 0.0,
            "kinds": list(KINDS), "out": "outputs/commbench", "device": "auto", "launcher": "local",
            "network": None}
# Message sizes when none are given. gloo on CPU reaches its bandwidth by 16 MiB; NVLink and
# InfiniBand need far larger messages (nccl-tests sweeps to GBs; bus bandwidth levels off
# around 256 MiB-1 GiB on NVLink), so a GPU ceiling measured at 16 MiB would understate them.
DEFAULT_SIZES = {"cpu": [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24],
                 "cuda": [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]}


def default_sizes(device: str) -> list[int]:
    return list(DEFAULT_SIZES[device])


def device_kind(requested: str) -> str:
    """cuda or cpu for run.device (auto: CUDA where NVML sees a GPU; not CUDA itself, so CPU ranks
    can still be forked from here): what the message sizes and the start method follow, on the
    local launcher and in an srun task alike."""
    if requested == "auto":
        from ddlbench.machine.gpus import visible_gpus
        return "cuda" if visible_gpus().available else "cpu"
    return "cuda" if requested == "cuda" else "cpu"


def expected_written(kind: str, nbytes: float, world: int, backend: str) -> float:
    """Mean bytes a rank sends for one op of `kind` on `backend` (send: only rank 0 sends)."""
    if kind == "send":
        return nbytes / world
    if kind == "reduce" and backend == "gloo":
        return gloo_reduce_sent(int(nbytes), world)
    return wire_factor(kind, world, backend) * nbytes


def parse_args(args: list[str]) -> dict:
    """`launcher.nproc=N sizes=[a,b] iters=K gap_ms=G kinds=[...] out=DIR run.device=cpu` -> options."""
    from ddlbench.settings.keyvalue import parse_key_values
    kv = parse_key_values(args, "commbench", DEFAULTS,
                          aliases={"launcher.nproc": "nproc", "run.device": "device", "launcher.name": "launcher"})
    d = DEFAULTS
    opts = {"nproc": kv.integer("nproc", d["nproc"], low=0), "sizes": kv.integers("sizes", d["sizes"], low=4),
            "iters": kv.integer("iters", d["iters"], low=0), "warmup": kv.integer("warmup", d["warmup"], low=0),
            "gap_ms": kv.number("gap_ms", d["gap_ms"], low=0.0), "kinds": kv.items("kinds", default=list(d["kinds"])),
            **{k: kv.text(k, d[k]) for k in ("out", "device", "launcher", "network")}}
    if opts["launcher"] not in ("local", "slurm"):
        raise ConfigError(f"commbench: launcher must be local or slurm, got {opts['launcher']!r}")
    bad = [k for k in opts["kinds"] if k not in KINDS + DIM_KINDS]
    if bad:
        raise ConfigError(f"commbench: unknown kinds {bad} (known: {', '.join(KINDS + DIM_KINDS)})")
    if (opts["nproc"] < 2 and opts["launcher"] == "local") or opts["iters"] < 1 or any(s < 4 for s in opts["sizes"] or []):
        raise ConfigError("commbench: needs launcher.nproc >= 2, iters >= 1 and sizes >= 4 bytes")
    if not 0 <= opts["gap_ms"] <= 10_000:
        raise ConfigError("commbench: gap_ms must be within [0, 10000]")
    return opts


def _elements(nbytes: int, world: int) -> int:
    """float32 elements of a full buffer of about `nbytes`, divisible by the world size."""
    return max(world, nbytes // 4 // world * world)


def _op(kind: str, nbytes: int, world: int, rank: int, device):
    """A closure running one collective of `nbytes` (full buffer), and the tensors it uses."""
    import torch
    import torch.distributed as dist

    n = _elements(nbytes, world)
    full = torch.ones(n, device=device)
    shard = torch.ones(n // world, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, shard)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(shard, full)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, 0)
    if kind == "reduce":
        return lambda: dist.reduce(full, 0)
    # p2p: rank 0 -> rank 1
    return {0: lambda: dist.send(full, 1), 1: lambda: dist.recv(full, 0)}.get(rank, lambda: None)


def _rank(rank: int, world: int, opts: dict, port: int | None, results: str) -> None:
    """One rank; `port` None: the environment already names the rendezvous (srun task)."""
    import torch
    import torch.distributed as dist

    from ddlbench.comm.probe import written_bytes
    from ddlbench.comm.topology import gather_hosts
    from ddlbench.launch.worker import pick_device

    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    device, backend = pick_device(opts["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    dist.barrier()                         # gloo's threads exist (and have their names)
    comm_threads = {"policy": commthreads.policy(), "threads": []}
    groups = None
    if any(k in DIM_KINDS for k in opts["kinds"]):    # ranks grouped by host
        groups = make_groups(gather_hosts())

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for kind in opts["kinds"]:
        if kind == "send":
            commthreads.reset()            # FIFO threads stall gloo's send/recv 1 s (ddlbench/comm/threads.py)
        else:                              # as the runner does ($DDLBENCH_COMM_THREADS, inside `bench cluster`)
            comm_threads = commthreads.apply()
        for size in opts["sizes"]:
            op = (group_op(kind, _elements(size, world), groups, device) if kind in DIM_KINDS
                  else _op(kind, size, world, rank, device))
            nbytes = _elements(size, world) * 4
            for _ in range(opts["warmup"]):
                op()
            sync()
            dist.barrier()
            w0 = written_bytes() if backend == "gloo" else None
            op()
            sync()
            written = written_bytes() - w0 if w0 is not None else None
            times = []
            for _ in range(opts["iters"]):
                dist.barrier()
                if opts["gap_ms"]:      # the link idle, as between a training step's collectives
                    time.sleep(opts["gap_ms"] / 1e3)
                t0 = time.perf_counter()
                op()
                sync()
                times.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "bytes": nbytes, "median_s": statistics.median(times),
                         "mean_s": statistics.fmean(times), "written": written,
                         **({"group": group_size(kind, groups["per_node"], groups["nodes"])} if kind in DIM_KINDS
                            else {})})
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    hosts = [None] * world
    dist.all_gather_object(hosts, (os.uname().nodename, comm_threads))
    if rank == 0:
        Path(results).write_text(json.dumps({"backend": backend, "device": device.type, "ranks": gathered,
                                             "hosts": [h for h, _ in hosts],
                                             "comm_threads": {
                                                 "policy": comm_threads["policy"],
                                                 "per_rank": [t["threads"] for _, t in hosts],
                                                 **({"note": "the send rows ran with the threads back to fair"}
                                                    if comm_threads["policy"] == "fifo" and "send" in opts["kinds"]
                                                    else {})}}))
    dist.barrier()
    dist.destroy_process_group()


def summarize(ranks: list[list[dict]], world: int, backend: str) -> list[dict]:
    """Per (kind, bytes): time = max over ranks of each rank's median (mean_time_s: of each rank's
    mean, where an op sometimes stalls the mean is what a step of many such ops pays); bandwidths; on gloo the mean
    written bytes per rank beside the wire factors' prediction."""
    out = []
    for i, row in enumerate(ranks[0]):
        per = [r[i] for r in ranks]
        t = max(p["median_s"] for p in per)
        p_ranks = row.get("group", world)               # a node's or a cross group's ranks
        base = "all_reduce" if row["kind"] in DIM_KINDS else row["kind"]
        alg, bus = bus_bandwidth(base, row["bytes"], t, p_ranks)
        entry = {"kind": row["kind"], "bytes": row["bytes"], "time_s": t, "algbw_Bps": alg, "busbw_Bps": bus,
                 **({"group_size": p_ranks} if "group" in row else {})}
        if all("mean_s" in p for p in per):     # what many ops cost on average, stalls included
            entry["mean_time_s"] = max(p["mean_s"] for p in per)
        if all(p["written"] is not None for p in per) and row["kind"] != "all_reduce_hier":
            entry["written_bytes_mean"] = sum(p["written"] for p in per) / world
            entry["wire_bytes_expected"] = expected_written(base, row["bytes"], p_ranks, backend)
        out.append(entry)
    return out


def run(args: list[str]) -> int:
    import tempfile

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    from ddlbench.launch.agent import reserve_port
    from ddlbench.launch.forked import rank_start_method
    from ddlbench.lifecycle.signals import Stopped, shield

    opts = parse_args(args)
    out = Path(opts["out"])
    out.mkdir(parents=True, exist_ok=True)
    if opts["launcher"] == "slurm":
        return _run_srun_task(opts, out)
    device = device_kind(opts["device"])
    if opts["sizes"] is None:
        opts["sizes"] = default_sizes(device)
    port, held = reserve_port()         # kept until the ranks end (rank 0's store binds it)
    with tempfile.TemporaryDirectory() as tmp, held:
        results = os.path.join(tmp, "ranks.json")
        ctx = mp.start_processes(_rank, args=(opts["nproc"], opts, port, results), nprocs=opts["nproc"],
                                 start_method=rank_start_method(device), join=False)
        try:
            while not ctx.join():
                pass
        except (KeyboardInterrupt, Stopped):    # end the ranks too (the command exits with os._exit)
            shield()
            for p in ctx.processes:     # nothing of theirs to save: no record is written
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join(5)
            raise
        except ProcessException as exc:    # a rank raised or died: say which, write nothing
            print(f"commbench: rank {exc.error_index} failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        raw = json.loads(Path(results).read_text())
    return _write(raw, opts, out, opts["nproc"])


def _run_srun_task(opts: dict, out: Path) -> int:
    """This process is one task of an srun step: rank, world and rendezvous from Slurm's
    environment (ddlbench.launch.slurm.rank_env); rank 0 writes the record."""
    import tempfile

    from ddlbench.launch.slurm import rank_env
    env = rank_env()
    os.environ.update(env)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    if world < 2:
        raise ConfigError("commbench launcher=slurm: needs an srun step of >= 2 tasks (srun -N2 ...)")
    if opts["sizes"] is None:
        opts["sizes"] = default_sizes(device_kind(opts["device"]))
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "ranks.json")
        _rank(rank, world, opts, None, results)
        if rank != 0:
            return 0
        raw = json.loads(Path(results).read_text())
    return _write(raw, opts, out, world)


def _write(raw: dict, opts: dict, out: Path, world: int) -> int:
    from ddlbench.network.fit import fits
    from ddlbench.record.results import atomic_write_json
    rows = summarize(raw["ranks"], world, raw["backend"])
    hosts = raw.get("hosts") or [os.uname().nodename]
    flat_rows = [r for r in rows if r["kind"] not in DIM_KINDS]
    record = {"schema": "ddlbench.commbench.command/1", "backend": raw["backend"], "device": raw["device"],
              "world_size": world, "iters": opts["iters"], "gap_ms": opts["gap_ms"], "hostname": os.uname().nodename,
              "hosts": hosts, "comm_threads": raw.get("comm_threads"), "launcher": opts["launcher"], "rows": rows, "fits": fits(flat_rows, world, raw["backend"]),
              "note": "time = max over ranks of each rank's median (mean_time_s: of each rank's mean); busbw = algbw x nccl-tests factor; "
                      "bytes = full buffer (all-gather output, reduce-scatter input); fits: alpha and "
                      "bandwidth of the network model's cost (ddlbench.network.fit)"}
    if len(flat_rows) < len(rows):      # ranks grouped by host (equal counts: commbench_dims.host_groups)
        nodes = len(set(hosts))
        record["dimension_fits"] = dimension_fits(rows, world // nodes, nodes, raw["backend"],
                                                  _described_dimensions(opts))
    atomic_write_json(out / "commbench.json", record)
    print(render(record))
    network = _fitted_network_file(record, opts, out)
    print(f"commbench: {out / 'commbench.json'}" + (f"; fitted network: {network}" if network else ""))
    return 0


def _described_dimensions(opts: dict) -> list[dict] | None:
    """The dimensions of the network the ranks ran on, as described ($DDLBENCH_NETWORK inside
    `bench cluster`, or network=)."""
    name = opts["network"] or os.environ.get("DDLBENCH_NETWORK")
    if not name:
        return None
    from ddlbench.network.model import load
    return [{"name": d.name, "bandwidth_GBps": d.bandwidth / 1e9} for d in load(name).dims]


def _fitted_network_file(record: dict, opts: dict, out: Path) -> Path | None:
    """<out>/network.yaml: the base network with the all-reduce fit (and every other kind's fit
    under `kinds`), where a base is named."""
    base_name = opts["network"] or os.environ.get("DDLBENCH_NETWORK")
    fit = next((f for f in record["fits"] if f["kind"] == "all_reduce" and "error" not in f), None)
    if not base_name or fit is None:
        return None
    import yaml

    from ddlbench.network.fit import fitted_network
    from ddlbench.network.model import load
    network = load(base_name)
    if record["world_size"] > network.max_devices:      # e.g. 2 ranks a node on bench cluster's 1-core nodes
        print(f"commbench: no network.yaml: {record['world_size']} ranks exceed the {network.max_devices} devices "
              f"network {network.name} describes (ranks share devices); the fits are in commbench.json "
              "(ddlbench.network.fit.add_world_fits keeps them beside a fitted network's)", file=sys.stderr)
        return None
    base = yaml.safe_load(Path(network.source).read_text())
    path = out / "network.yaml"
    path.write_text(yaml.safe_dump(fitted_network(base, fit, record["world_size"], record["fits"]), sort_keys=False))
    return path


def render(record: dict) -> str:
    lines = [f"{'kind':<15}{'bytes':>12}{'time_ms':>10}{'algbw_GB/s':>12}{'busbw_GB/s':>12}"
             + (f"{'written/wire':>14}" if record["backend"] == "gloo" else "")]
    for r in record["rows"]:
        line = (f"{r['kind']:<15}{r['bytes']:>12}{r['time_s'] * 1e3:>10.3f}{r['algbw_Bps'] / 1e9:>12.3f}"
                f"{r['busbw_Bps'] / 1e9:>12.3f}")
        if r.get("wire_bytes_expected"):
            line += f"{r['written_bytes_mean'] / r['wire_bytes_expected']:>14.4f}"
        lines.append(line)
    for f in record.get("fits", []):
        if "error" in f:
            lines.append(f"fit {f['kind']:<15} none: {f['error']}")
            continue
        lines.append(f"fit {f['kind']:<15} alpha {f['alpha_s'] * 1e6:9.1f} us   bandwidth {f['bandwidth_Bps'] / 1e9:8.4f} GB/s"
                     f"   worst residual {f['max_rel_residual']:.1%}")
    for dim, f in (record.get("dimension_fits") or {}).items():
        if "error" in f:
            lines.append(f"dimension {dim:<9} none: {f['error']}")
            continue
        vs = (f"   {f['fit_over_described']:.3f}x the described {f['described_bandwidth_Bps'] / 1e9:.4f} GB/s"
              if "fit_over_described" in f else "")
        lines.append(f"dimension {dim:<9} alpha {f['alpha_s'] * 1e6:9.1f} us   bandwidth {f['bandwidth_Bps'] / 1e9:8.4f} "
                     f"GB/s per device{vs}")
    return "\n".join(lines)


def ceilings(record: dict) -> dict[str, float]:
    """Best busbw per kind: the ceiling a run's achieved busbw is compared with."""
    best: dict[str, float] = {}
    for r in record["rows"]:
        best[r["kind"]] = max(best.get(r["kind"], 0.0), r["busbw_Bps"])
    return best
