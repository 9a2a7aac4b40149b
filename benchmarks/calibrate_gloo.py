"""Calibrate conf/network/local_gloo.yaml: the alpha-beta parameters of gloo all-reduce between
processes on this machine (what `bench project` subtracts from a measured CPU step to get its
compute time, and what the projection validation uses).

    .venv/bin/python benchmarks/calibrate_gloo.py            # prints the fit, writes the yaml
    .venv/bin/python benchmarks/calibrate_gloo.py --dry-run  # prints only

2 ranks, ring all-reduce of 4 KiB ... 16 MiB fp32 buffers, median of repeats; least squares of
T = 2 (p-1) alpha + 2 (p-1)/p B / bandwidth.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [2**k for k in range(12, 25, 2)]     # bytes: 4 KiB .. 16 MiB
REPEATS = 15
OUT = Path(__file__).resolve().parents[1] / "conf" / "network" / "local_gloo.yaml"


def _worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    times = {}
    for b in SIZES:
        t = torch.ones(b // 4)
        for _ in range(3):
            dist.all_reduce(t)
        samples = []
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - t0)
        times[b] = statistics.median(samples)
    if rank == 0:
        queue.put(times)
    dist.destroy_process_group()


def measure(world: int = 2, port: int = 29611) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    times = q.get(timeout=300)
    for p in procs:
        p.join(60)
    return times


def fit(times: dict[int, float], p: int) -> tuple[float, float]:
    """(alpha s, bandwidth bytes/s) by least squares."""
    a = np.array([[2 * (p - 1), 2 * (p - 1) / p * b] for b in times])
    y = np.array(list(times.values()))
    (alpha, beta), *_ = np.linalg.lstsq(a, y, rcond=None)
    return max(float(alpha), 0.0), 1.0 / float(beta)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    times = measure()
    alpha, bw = fit(times, 2)
    for b, t in times.items():
        model = 2 * alpha + b / bw
        print(f"{b:>10,} B  measured {t * 1e3:8.3f} ms  model {model * 1e3:8.3f} ms")
    print(f"alpha {alpha * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s")
    if not args.dry_run:
        OUT.write_text(
            "# gloo between processes on one machine (shared memory / loopback TCP), calibrated by\n"
            "# benchmarks/calibrate_gloo.py (2 ranks, all-reduce 4 KiB..16 MiB, least squares).\n"
            f"# Measured {time.strftime('%Y-%m-%d')} on {os.uname().nodename} ({os.cpu_count()} cores).\n"
            "name: local_gloo\n"
            "description: gloo on one host, calibrated\n"
            "dimensions:\n"
            "  - name: host\n"
            "    size: 64\n"
            f"    bandwidth_GBps: {bw / 1e9:.4f}\n"
            f"    latency_us: {alpha * 1e6:.1f}\n"
            "    cost_per_GBps: 0.0\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
