"""Does the harness cost throughput? Compares `bench run framework=ddp` (the runner) with a bare,
hand-written DDP loop (the reference) on the same model as built for the device (attention kernel,
GPT-2's GELU, padded vocabulary), batch, data, precision recipe (autocast over fp32 parameters at
bf16), optimizer implementation (optim.impl=auto: fused on CUDA, for-loop on CPU), compile setting
(Module.compile per block before DDP, as the runner does), thread count and start method (spawn: on
CPU the runner's default, fork, cost 4.6% of eager throughput, 8 alternating pairs), alternating them in
one session; both timed by the runner's statistic (global batch / the measured window's wall time
per step, the slowest rank's), the median step beside it. Prints the median of the alternating
pairs' ratios (target >= 0.97).
On CUDA (NCCL, one GPU per rank) it also compares the runner's peak allocated memory with the
bare loop's (the allocator's own counter in both programs, reset after set-up: what the harness
adds), and checks that counter against one it does not keep: the driver's used memory
(cudaMemGetInfo, the whole device with the CUDA context) must hold the bare loop's peak reserved,
which must hold its peak allocated.

    .venv/bin/python benchmarks/runner_overhead.py [--model gpt2_tiny] [--nproc 2] [--steps 40]
        [--repeats 3] [--device cpu|cuda] [--precision fp32|bf16] [--compile] [--json OUT.json]
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
               warmup: int, threads: int, out: str, device_type: str, precision: str = "fp32",
               compile_blocks: bool = False) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddlbench import models
    from ddlbench.adapters.optim import IMPL_KWARGS, optimizer_impl
    from ddlbench.planning.config import plan_from_overrides

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device_type == "cuda"
    if not cuda:     # the host allocator's thresholds every CPU rank of the runner has (ddlbench/rank/malloc.py)
        from ddlbench.rank import malloc
        malloc.steady()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=nproc)
    cfg = plan_from_overrides([f"model={model}", f"run.precision={precision}"]).cfg
    torch.manual_seed(0)
    spec = models.build(cfg.model, device_type)
    net = spec.build().to(device)
    if compile_blocks:
        for block in net.blocks():
            block.compile()
    model = DDP(net, gradient_as_bucket_view=True, device_ids=[rank] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                            weight_decay=cfg.optim.weight_decay, **IMPL_KWARGS[optimizer_impl("auto", device_type)])
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    local = global_batch // nproc
    data = models.SyntheticData(spec, 0, global_batch, rank, local, 4, device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    from ddlbench.rank.gcpolicy import GcPolicy  # the runner's collector policy (run.gc), the same calls
    collector = GcPolicy(cfg.run.gc, cfg.run.gc_every)
    collector.before_loop()
    t_prev = time.perf_counter()
    for step in range(warmup + steps):
        collector.in_step(step)
        with torch.autocast(device_type, dtype=low, enabled=low is not None):
            loss = model(**data.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:   # the runner's step boundary on CUDA: the compute stream, not the device
            torch.cuda.current_stream(device).synchronize()
        t = time.perf_counter()
        if step >= warmup:
            times.append(t - t_prev)
        t_prev = t
        if step == 0:
            collector.after_first_step()
            t_prev = time.perf_counter()
    collector.after_loop()
    peak = None
    if cuda:   # the allocator's counters, then the driver's view of the device (not the allocator's)
        free, total = torch.cuda.mem_get_info(device)
        peak = {"allocated": torch.cuda.max_memory_allocated(device),
                "reserved": torch.cuda.max_memory_reserved(device), "driver_used": total - free}
    gathered = [None] * nproc
    dist.all_gather_object(gathered, (times, peak))
    if rank == 0:
        step_max = [max(g[0][i] for g in gathered) for i in range(steps)]
        window = max(sum(g[0]) for g in gathered) / steps    # the runner's statistic (metrics.timing)
        Path(out).write_text(json.dumps({"samples_per_s": global_batch / window,
                                         "samples_per_s_median_step": global_batch / statistics.median(step_max),
                                         "peak_allocated_bytes": [g[1] and g[1]["allocated"] for g in gathered],
                                         "bare_memory": [g[1] for g in gathered]}))
    dist.destroy_process_group()


def bare(model: str, nproc: int, global_batch: int, steps: int, warmup: int, device: str = "cpu",
         precision: str = "fp32", compile_blocks: bool = False) -> dict:
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = max(1, len(os.sched_getaffinity(0)) // nproc)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/sps.json"
        mp.start_processes(_bare_rank, args=(nproc, port, model, global_batch, steps, warmup, threads, out, device,
                                             precision, compile_blocks),
                           nprocs=nproc, start_method="spawn")
        return json.loads(Path(out).read_text())


def harness(model: str, nproc: int, global_batch: int, steps: int, warmup: int, device: str = "cpu",
            precision: str = "fp32", compile_blocks: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "ddlbench.cli", "run", "framework=ddp", f"model={model}",
               f"launcher.nproc={nproc}", f"run.global_batch={global_batch}", f"run.measure_steps={steps}",
               f"run.warmup_steps={warmup}", f"run.precision={precision}", f"run.device={device}",
               f"run.compile={str(compile_blocks).lower()}", "launcher.start_method=spawn",
               "run.comm_profile=false", "logger=none", "run.progress=false", f"run.dir={d}/r"]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        rec = json.loads(Path(f"{d}/r/result.json").read_text())
        return {"samples_per_s": rec["throughput"]["samples_per_s"],
                "samples_per_s_median_step": global_batch / rec["timing"]["step_time_s"]["median"],
                "peak_allocated_bytes": [r["peak_allocated_bytes"] for r in rec["memory"]["per_rank"]]}


TARGET = 0.97


def pair_ratio(runner: list[float], reference: list[float]) -> float:
    """The median of runner/reference over alternating pairs (drift between pairs cancels)."""
    return statistics.median(r / b for r, b in zip(runner, reference))


def allocator_within_driver(allocated: int, reserved: int, driver_used: int) -> bool:
    """The allocator's peaks against the driver's used memory (a counter it does not keep):
    allocated <= reserved (cached blocks are not returned during the loop) <= driver used."""
    return 0 < allocated <= reserved <= driver_used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true", help="both compile every block (run.compile=true)")
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    a = ap.parse_args()
    bare_runs, harness_runs = [], []
    recipe = (a.device, a.precision, a.compile)
    for i in range(a.repeats):  # alternate, each pair in a different order, so drift affects both alike
        pair = [("bare", bare), ("runner", harness)][:: 1 if i % 2 == 0 else -1]
        for name, fn in pair:
            (bare_runs if name == "bare" else harness_runs).append(
                fn(a.model, a.nproc, a.global_batch, a.steps, a.warmup, *recipe))
        print(f"repeat {i}: bare {bare_runs[-1]['samples_per_s']:.2f} samples/s, "
              f"runner {harness_runs[-1]['samples_per_s']:.2f} samples/s, "
              f"ratio {harness_runs[-1]['samples_per_s'] / bare_runs[-1]['samples_per_s']:.3f}", flush=True)
    bare_sps = statistics.median(r["samples_per_s"] for r in bare_runs)
    harness_sps = statistics.median(r["samples_per_s"] for r in harness_runs)
    ratio = pair_ratio([r["samples_per_s"] for r in harness_runs], [r["samples_per_s"] for r in bare_runs])
    ratio_median = pair_ratio([r["samples_per_s_median_step"] for r in harness_runs],
                              [r["samples_per_s_median_step"] for r in bare_runs])
    out = {"model": a.model, "nproc": a.nproc, "device": a.device, "precision": a.precision, "compile": a.compile,
           "global_batch": a.global_batch, "steps": a.steps, "repeats": a.repeats, "bare_samples_per_s": bare_sps,
           "runner_samples_per_s": harness_sps, "ratio": ratio, "ratio_median_step": ratio_median,
           "pairs": [[h["samples_per_s"], b["samples_per_s"]] for h, b in zip(harness_runs, bare_runs)],
           "target": TARGET}
    print(f"{a.model} x{a.nproc} ranks on {a.device}, {a.precision}, compile={a.compile}, global batch "
          f"{a.global_batch}, {a.steps} steps, {a.repeats} repeats")
    print(f"median bare {bare_sps:.2f} samples/s, runner {harness_sps:.2f} samples/s")
    print(f"runner/bare throughput ratio (median of pairs): {ratio:.3f} (target >= {TARGET}); "
          f"on the median step instead of the window: {ratio_median:.3f}")
    if a.device == "cuda":   # rank 0, last repeat of each: same model, batch, optimizer, reset points
        runner_peak, bare_peak = harness_runs[-1]["peak_allocated_bytes"][0], bare_runs[-1]["peak_allocated_bytes"][0]
        mem = bare_runs[-1]["bare_memory"][0]
        out.update(runner_peak_allocated_bytes=runner_peak, bare_peak_allocated_bytes=bare_peak,
                   peak_ratio=runner_peak / bare_peak, bare_peak_reserved_bytes=mem["reserved"],
                   bare_driver_used_bytes=mem["driver_used"],
                   allocator_within_driver=allocator_within_driver(mem["allocated"], mem["reserved"], mem["driver_used"]))
        print(f"peak allocated: runner {runner_peak / 2**20:.1f} MiB, bare loop {bare_peak / 2**20:.1f} MiB "
              f"(ratio {runner_peak / bare_peak:.3f}; the allocator's counter in both)")
        print(f"bare loop: allocated {mem['allocated'] / 2**20:.1f} <= reserved {mem['reserved'] / 2**20:.1f} <= "
              f"driver used {mem['driver_used'] / 2**20:.1f} MiB: {out['allocator_within_driver']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
