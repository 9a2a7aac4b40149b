"""Whose is a collective's extra time on `bench cluster`'s one-core nodes: the link's, TCP's, or
the scheduling of gloo's threads? 2 ranks, one a node; per size, each op back to back and after
50 ms of spinning (as compute leaves the CPU), three ways:

- `tcp`: a plain TCP exchange between the two nodes (rank 0 sends N bytes, rank 1 sends them
  back: 2N bytes on the wire, one after the other), no gloo;
- `gloo`: a gloo all-reduce of N bytes (N each way at once), its threads as gloo makes them;
- `gloo_nice`: the same with gloo's threads (gloo_tcp_loop, pt_gloo_runloop) at nice -20, the
  fair scheduler's largest weight (tried as the safer knob; it did not help after compute);
- `gloo_fifo`: the same with those threads SCHED_FIFO, as `bench cluster` sets them by default
  (ddlbench/comm/threads.py; not for point-to-point ops, which it stalled by exactly 1 s).

For the gloo rows, also the CPU time gloo's threads ran and waited runnable (in the run queue)
per op, from /proc/self/task/*/schedstat (each op's barrier included). Rank 0 writes OUT.json and
prints the table.

    bench cluster up nodes=2 link=10gbit name=probe
    bench cluster exec name=probe -- srun -N2 -n2 $PWD/.venv/bin/python $PWD/benchmarks/cluster_host_probe.py OUT.json
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path

from cluster_op_stalls import GAP_S, collect, spin

SIZES = (262144, 1048576)
ITERS = 20
MODES = ("back_to_back", "after_spin")


def gloo_thread_times() -> tuple[float, float, list[int]]:
    """Seconds gloo's threads ran and waited runnable so far, and their tids."""
    from ddlbench.comm.threads import selected, threads
    run = wait = 0.0
    tids = []
    for tid, _ in selected(threads()):
        try:
            fields = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
        except OSError:      # the thread ended meanwhile
            continue
        run, wait = run + int(fields[0]) / 1e9, wait + int(fields[1]) / 1e9
        tids.append(tid)
    return run, wait, tids


def connect(rank: int, host: str, port: int) -> socket.socket:
    if rank == 0:
        srv = socket.create_server(("", port))
        conn, _ = srv.accept()
        srv.close()
    else:
        for _ in range(200):
            try:
                conn = socket.create_connection((host, port))
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"no connection to {host}:{port}")
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def exchange(conn: socket.socket, rank: int, payload: bytes) -> None:
    def receive(n: int) -> None:
        while n:
            n -= len(conn.recv(min(n, 1 << 20)))
    if rank == 0:
        conn.sendall(payload)
        receive(len(payload))
    else:
        receive(len(payload))
        conn.sendall(payload)


def measure() -> list[dict] | None:
    import torch
    import torch.distributed as dist

    from ddlbench.launch.slurm import rank_env
    os.environ.update(rank_env())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    conn = connect(rank, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1)
    rows = []
    for variant in ("tcp", "gloo", "gloo_nice", "gloo_fifo"):
        for tid in gloo_thread_times()[2]:
            if variant == "gloo_nice":
                os.setpriority(os.PRIO_PROCESS, tid, -20)
            elif variant == "gloo_fifo":
                os.setpriority(os.PRIO_PROCESS, tid, 0)
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
        for size in SIZES:
            tensor, payload = torch.ones(size // 4), b"x" * size
            op = ((lambda payload=payload: exchange(conn, rank, payload)) if variant == "tcp"
                  else (lambda tensor=tensor: dist.all_reduce(tensor)))
            for mode in MODES:
                op(), op()
                times = []
                run0, wait0, _ = gloo_thread_times()
                for _ in range(ITERS):
                    dist.barrier()
                    if mode == "after_spin":
                        spin(GAP_S)
                    t0 = time.perf_counter()
                    op()
                    times.append(time.perf_counter() - t0)
                run1, wait1, _ = gloo_thread_times()
                rows.append({"variant": variant, "bytes": size, "mode": mode, "times_s": times,
                             "gloo_run_s": (run1 - run0) / ITERS, "gloo_wait_s": (wait1 - wait0) / ITERS})
    conn.close()
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"host": os.uname().nodename, "rows": rows})
    dist.destroy_process_group()
    return ranks if rank == 0 else None


def summary(ranks: list[dict]) -> list[dict]:
    """Per row: op time = the slowest rank's, per op; gloo's threads' time, the busier rank's."""
    out = []
    for i, row in enumerate(ranks[0]["rows"]):
        per = [r["rows"][i] for r in ranks]
        ops = [max(p["times_s"][k] for p in per) for k in range(len(row["times_s"]))]
        out.append({"variant": row["variant"], "bytes": row["bytes"], "mode": row["mode"],
                    "median_ms": statistics.median(ops) * 1e3, "over_2ms": sum(o > 2e-3 for o in ops) / len(ops),
                    "gloo_run_ms": max(p["gloo_run_s"] for p in per) * 1e3,
                    "gloo_wait_ms": max(p["gloo_wait_s"] for p in per) * 1e3})
    return out


def main() -> int:
    rows = collect("cluster_host_probe.py", measure, summary)
    if isinstance(rows, int):
        return rows
    print(f"{'variant':10} {'bytes':>8} {'mode':13} {'median ms':>9} {'> 2 ms':>7} "
          f"{'gloo run ms/op':>14} {'gloo runnable-wait ms/op':>24}")
    for r in rows:
        gloo = ("" if r["variant"] == "tcp" else f"{r['gloo_run_ms']:14.2f} {r['gloo_wait_ms']:24.2f}")
        print(f"{r['variant']:10} {r['bytes']:8} {r['mode']:13} {r['median_ms']:9.2f} {r['over_2ms']:7.0%} {gloo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
