"""`bench commbench launcher.nproc=N`: the machine's ceiling for each collective, on the backend and
ranks a run uses (gloo on CPU, NCCL on GPU), over message sizes.

Per kind and size: the op's time (each rank's median over `iters`, max over ranks), algbw = bytes /
time and busbw = algbw x the nccl-tests factor (all-reduce 2(N-1)/N; all-gather, reduce-scatter
(N-1)/N; broadcast, reduce, p2p 1), where bytes is the full buffer (all-gather: the gathered size;
reduce-scatter: the input) as in nccl-tests and in the runs' comm records. On gloo each rank also
records the bytes it wrote to its sockets during one op (/proc/self/io), beside what the wire
factors of bench/metrics/comm.py predict: the check that the run records' wire bytes are true.

Ranks are local processes (fork on CPU, spawn on CUDA); multi-node ceilings: not yet.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.errors import ConfigError
from bench.metrics.comm import bus_bandwidth, gloo_reduce_sent, wire_factor

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send")
DEFAULTS = {"nproc": 2, "sizes": None, "iters": 5, "warmup": 2,
            "kinds": list(KINDS), "out": "outputs/commbench", "device": "auto"}
# Message sizes when none are given. gloo on CPU reaches its bandwidth by 16 MiB; NVLink and
# InfiniBand need far larger messages (nccl-tests sweeps to GBs; bus bandwidth levels off
# around 256 MiB-1 GiB on NVLink), so a GPU ceiling measured at 16 MiB would understate them.
DEFAULT_SIZES = {"cpu": [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24],
                 "cuda": [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]}


def default_sizes(device: str) -> list[int]:
    return list(DEFAULT_SIZES[device])


def expected_written(kind: str, nbytes: float, world: int, backend: str) -> float:
    """Mean bytes a rank sends for one op of `kind` on `backend` (send: only rank 0 sends)."""
    if kind == "send":
        return nbytes / world
    if kind == "reduce" and backend == "gloo":
        return gloo_reduce_sent(int(nbytes), world)
    return wire_factor(kind, world, backend) * nbytes


def parse_args(args: list[str]) -> dict:
    """`launcher.nproc=N sizes=[a,b] iters=K kinds=[...] out=DIR run.device=cpu` -> options."""
    opts = {k: (list(v) if isinstance(v, list) else v) for k, v in DEFAULTS.items()}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"commbench: expected key=value, got {arg!r}")
        key = {"launcher.nproc": "nproc", "run.device": "device"}.get(key, key)
        if key not in opts:
            raise ConfigError(f"commbench: unknown option {key!r} (known: launcher.nproc, sizes, iters, "
                              "warmup, kinds, out, run.device)")
        if key in ("sizes", "kinds"):
            items = [v for v in value.strip("[]").split(",") if v]
            opts[key] = [int(v) for v in items] if key == "sizes" else items
        elif key in ("nproc", "iters", "warmup"):
            opts[key] = int(value)
        else:
            opts[key] = value
    bad = [k for k in opts["kinds"] if k not in KINDS]
    if bad:
        raise ConfigError(f"commbench: unknown kinds {bad} (known: {', '.join(KINDS)})")
    if opts["nproc"] < 2 or opts["iters"] < 1 or any(s < 4 for s in opts["sizes"] or []):
        raise ConfigError("commbench: needs launcher.nproc >= 2, iters >= 1 and sizes >= 4 bytes")
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


def _rank(rank: int, world: int, opts: dict, port: int, results: str) -> None:
    import torch
    import torch.distributed as dist

    from bench.comm_probe import written_bytes
    from bench.launch.worker import pick_device

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    device, backend = pick_device(opts["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for kind in opts["kinds"]:
        for size in opts["sizes"]:
            op = _op(kind, size, world, rank, device)
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
                t0 = time.perf_counter()
                op()
                sync()
                times.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "bytes": nbytes, "median_s": statistics.median(times), "written": written})
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        Path(results).write_text(json.dumps({"backend": backend, "device": device.type, "ranks": gathered}))
    dist.barrier()
    dist.destroy_process_group()


def summarize(ranks: list[list[dict]], world: int, backend: str) -> list[dict]:
    """Per (kind, bytes): time = max over ranks of each rank's median; bandwidths; on gloo the mean
    written bytes per rank beside the wire factors' prediction."""
    out = []
    for i, row in enumerate(ranks[0]):
        per = [r[i] for r in ranks]
        t = max(p["median_s"] for p in per)
        alg, bus = bus_bandwidth(row["kind"], row["bytes"], t, world)
        entry = {"kind": row["kind"], "bytes": row["bytes"], "time_s": t, "algbw_Bps": alg, "busbw_Bps": bus}
        if all(p["written"] is not None for p in per):
            entry["written_bytes_mean"] = sum(p["written"] for p in per) / world
            entry["wire_bytes_expected"] = expected_written(row["kind"], row["bytes"], world, backend)
        out.append(entry)
    return out


def run(args: list[str]) -> int:
    import tempfile

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    from bench.launch.agent import free_port
    from bench.launch.forked import rank_start_method

    opts = parse_args(args)
    out = Path(opts["out"])
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if opts["device"] == "cuda" else "cpu"
    if opts["device"] == "auto":     # NVML, not CUDA: CPU ranks are forked from here
        from bench.gpus import visible_gpus
        device = "cuda" if visible_gpus().available else "cpu"
    if opts["sizes"] is None:
        opts["sizes"] = default_sizes(device)
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "ranks.json")
        try:
            mp.start_processes(_rank, args=(opts["nproc"], opts, free_port(), results), nprocs=opts["nproc"],
                               start_method=rank_start_method(device))
        except ProcessException as exc:    # a rank raised or died: say which, write nothing
            print(f"commbench: rank {exc.error_index} failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        raw = json.loads(Path(results).read_text())
    world = opts["nproc"]
    record = {"schema": "ddlbench.commbench/1", "backend": raw["backend"], "device": raw["device"],
              "world_size": world, "iters": opts["iters"], "hostname": os.uname().nodename,
              "rows": summarize(raw["ranks"], world, raw["backend"]),
              "note": "time = max over ranks of each rank's median; busbw = algbw x nccl-tests factor; "
                      "bytes = full buffer (all-gather output, reduce-scatter input)"}
    from bench.results import atomic_write_json
    atomic_write_json(out / "commbench.json", record)
    print(render(record))
    print(f"commbench: {out / 'commbench.json'}")
    return 0


def render(record: dict) -> str:
    lines = [f"{'kind':<15}{'bytes':>12}{'time_ms':>10}{'algbw_GB/s':>12}{'busbw_GB/s':>12}"
             + (f"{'written/wire':>14}" if record["backend"] == "gloo" else "")]
    for r in record["rows"]:
        line = (f"{r['kind']:<15}{r['bytes']:>12}{r['time_s'] * 1e3:>10.3f}{r['algbw_Bps'] / 1e9:>12.3f}"
                f"{r['busbw_Bps'] / 1e9:>12.3f}")
        if r.get("wire_bytes_expected"):
            line += f"{r['written_bytes_mean'] / r['wire_bytes_expected']:>14.4f}"
        lines.append(line)
    return "\n".join(lines)


def ceilings(record: dict) -> dict[str, float]:
    """Best busbw per kind: the ceiling a run's achieved busbw is compared with."""
    best: dict[str, float] = {}
    for r in record["rows"]:
        best[r["kind"]] = max(best.get(r["kind"], 0.0), r["busbw_Bps"])
    return best
