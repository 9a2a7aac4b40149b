"""Where a collective's time goes on `bench cluster`'s one-core nodes: per kind and size, each op
timed back to back, after the ranks slept (the link and the CPU idle) and after they spun (the CPU
busy, as compute leaves it), on CLOCK_MONOTONIC, which the cluster's namespaces share, so the
ranks' start skew is measured too. Prints, per mode, the median and mean op time, the start skew
and the share of ops that took over 2 ms.

    bench cluster up nodes=2 link=10gbit name=stalls
    bench cluster exec name=stalls -- srun -N2 -n2 $PWD/.venv/bin/python $PWD/benchmarks/cluster_op_stalls.py OUT.json

(link=100gbit: tbf at a rate nothing here reaches, the link effectively unshaped.) Measured
2026-11-25, reports/network/README.md: at 10 Gbit/s a 256 KiB all-reduce takes ~0.3-0.5 ms or
4-6 ms, the same unshaped: the node's one core, not the link.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

GAP_S = 0.05
ITERS = 15
SIZES = (262144, 1048576, 4194304)
MODES = ("back_to_back", "after_sleep", "after_spin")


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure() -> list[tuple]:
    import torch
    import torch.distributed as dist

    from ddlbench.launch.slurm import rank_env
    os.environ.update(rank_env())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for kind in ("all_reduce", "all_gather"):
        for size in SIZES:
            full = torch.ones(size // 4)
            part = torch.ones(size // 4 // world)
            op = ((lambda full=full: dist.all_reduce(full)) if kind == "all_reduce"
                  else (lambda full=full, part=part: dist.all_gather_into_tensor(full, part)))
            for mode in MODES:
                op(), op()
                for _ in range(ITERS):
                    dist.barrier()
                    if mode == "after_sleep":
                        time.sleep(GAP_S)
                    elif mode == "after_spin":
                        spin(GAP_S)
                    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
                    op()
                    rows.append((kind, size, mode, t0, time.clock_gettime(time.CLOCK_MONOTONIC)))
    ranks = [None] * world
    dist.all_gather_object(ranks, {"host": os.uname().nodename, "rows": rows})
    dist.destroy_process_group()
    return ranks if rank == 0 else None


def summary(ranks: list[dict]) -> list[dict]:
    """Per (kind, size, mode): op time = the slowest rank's; skew = latest start - earliest."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for i, row in enumerate(ranks[0]["rows"]):
        per = [r["rows"][i] for r in ranks]
        op = max(p[4] - p[3] for p in per)
        skew = max(p[3] for p in per) - min(p[3] for p in per)
        groups.setdefault(tuple(row[:3]), []).append((op, skew))
    return [{"kind": k, "bytes": b, "mode": m, "median_ms": statistics.median(o for o, _ in v) * 1e3,
             "mean_ms": statistics.fmean(o for o, _ in v) * 1e3,
             "skew_median_ms": statistics.median(s for _, s in v) * 1e3,
             "over_2ms": sum(o > 2e-3 for o, _ in v) / len(v)} for (k, b, m), v in groups.items()]


def collect(script: str, measure, summary) -> list[dict] | int:
    """The usage said before measuring (exit code 2), then measure(); rank 0 writes OUT.json and
    gets summary(ranks)'s rows, every other rank exit code 0."""
    if len(sys.argv) != 2:
        print(f"usage: srun -N2 -n2 python benchmarks/{script} OUT.json", file=sys.stderr)
        return 2
    ranks = measure()
    if ranks is None:
        return 0
    rows = summary(ranks)
    Path(sys.argv[1]).write_text(json.dumps({"hosts": [r["host"] for r in ranks], "summary": rows, "ranks": ranks}))
    return rows


def main() -> int:
    rows = collect("cluster_op_stalls.py", measure, summary)
    if isinstance(rows, int):
        return rows
    print(f"{'kind':11} {'bytes':>8} {'mode':13} {'median ms':>9} {'mean ms':>8} {'skew ms':>8} {'> 2 ms':>7}")
    for r in rows:
        print(f"{r['kind']:11} {r['bytes']:8} {r['mode']:13} {r['median_ms']:9.2f} {r['mean_ms']:8.2f} "
              f"{r['skew_median_ms']:8.3f} {r['over_2ms']:7.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
