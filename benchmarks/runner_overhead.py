"""Does the harness cost throughput? Compares `bench run` (the runner) with a bare,
hand-written DDP loop on the same model, batch, data, optimizer and thread count, alternating
them in one session, and prints the ratio of median samples/s (target >= 0.99).

    .venv/bin/python benchmarks/runner_overhead.py [--model gpt2_tiny] [--nproc 2] [--steps 40] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bare_rank(rank: int, nproc: int, port: int, model: str, global_batch: int, steps: int,
               warmup: int, threads: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import models
    from bench.config import plan_from_overrides

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    cfg = plan_from_overrides([f"model={model}"]).cfg
    torch.manual_seed(0)
    spec = models.build(cfg.model)
    model = DDP(spec.build(), gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    local = global_batch // nproc
    data = models.SyntheticData(spec, 0, global_batch, rank, local, 4, torch.device("cpu"))
    times = []
    t_prev = time.perf_counter()
    for step in range(warmup + steps):
        loss = model(**data.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter()
        if step >= warmup:
            times.append(t - t_prev)
        t_prev = t
    gathered = [None] * nproc
    dist.all_gather_object(gathered, times)
    if rank == 0:
        step_max = [max(g[i] for g in gathered) for i in range(steps)]
        Path(out).write_text(json.dumps(global_batch / statistics.median(step_max)))
    dist.destroy_process_group()


def bare(model: str, nproc: int, global_batch: int, steps: int, warmup: int) -> float:
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = max(1, len(os.sched_getaffinity(0)) // nproc)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/sps.json"
        mp.start_processes(_bare_rank, args=(nproc, port, model, global_batch, steps, warmup, threads, out),
                           nprocs=nproc, start_method="spawn")
        return json.loads(Path(out).read_text())


def harness(model: str, nproc: int, global_batch: int, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "bench.cli", "run", "framework=ddp", f"model={model}",
               f"launcher.nproc={nproc}", f"run.global_batch={global_batch}", f"run.measure_steps={steps}",
               f"run.warmup_steps={warmup}", "logger=none", "run.progress=false", f"run.dir={d}/r"]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        return json.loads(Path(f"{d}/r/result.json").read_text())["throughput"]["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    bare_sps, harness_sps = [], []
    for i in range(a.repeats):  # alternate so drift affects both equally
        bare_sps.append(bare(a.model, a.nproc, a.global_batch, a.steps, a.warmup))
        harness_sps.append(harness(a.model, a.nproc, a.global_batch, a.steps, a.warmup))
        print(f"repeat {i}: bare {bare_sps[-1]:.2f} samples/s, runner {harness_sps[-1]:.2f} samples/s")
    ratio = statistics.median(harness_sps) / statistics.median(bare_sps)
    print(f"{a.model} x{a.nproc} ranks, global batch {a.global_batch}, {a.steps} steps, {a.repeats} repeats")
    print(f"median bare {statistics.median(bare_sps):.2f} samples/s, runner {statistics.median(harness_sps):.2f} samples/s")
    print(f"runner/bare throughput ratio: {ratio:.3f} (target >= 0.99)")


if __name__ == "__main__":
    main()
