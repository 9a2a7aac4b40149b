"""The ONLY timed training loop.

Warm-up steps, then measured steps (or, with run.epochs, whole epochs with evaluations between
steps: ddlbench/quality.py). Each rank records its own step times (boundary to
boundary; device-synchronised on GPU) and losses; nothing is communicated inside the window
beyond what the framework itself does. After the window the per-rank series are gathered once
and rank 0 writes the result (ddlbench/collect.py).
"""
from __future__ import annotations

import contextlib
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddlbench import commthreads, models
from ddlbench.adapters.base import RankContext
from ddlbench.collect import build_ok_record, fill_convergence, write_metrics_jsonl
from ddlbench.config import Plan
from ddlbench.faults import FaultInjector
from ddlbench.launch import events, stop
from ddlbench.memtrack import RunTracker
from ddlbench.metrics.convergence import reached, resolve_target
from ddlbench.models.datasets import build_dataset
from ddlbench.optim import build_optimizer_factory
from ddlbench.quality import Evaluator, batch_source, final_objective
from ddlbench.results import write_result

STEP_SYNC = {"cuda": "torch.cuda.current_stream().synchronize()", "cpu": None}


def step_sync(device_type: str):
    """How a step boundary waits for the device: on CUDA the compute stream only, never the
    whole device, so communication a framework leaves in flight on its own stream across steps
    (DASO's global all-reduce) stays in flight, as it would without the benchmark. Anything the
    next step's compute needs, the framework makes that stream wait for itself."""
    return STEP_SYNC.get(device_type)


def _sync(device: torch.device) -> None:
    if step_sync(device.type):
        torch.cuda.current_stream(device).synchronize()


class _Progress:
    """tqdm on rank 0: step, loss, samples/s. Refreshes at most ~4 times a second."""

    def __init__(self, enabled: bool, total: int, warmup: int, global_batch: int):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="train", unit="step", mininterval=0.25, leave=True,
                            dynamic_ncols=True)
        self.warmup, self.global_batch, self._last = warmup, global_batch, 0.0

    def update(self, step: int, loss, step_s: float) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        now = time.monotonic()
        if now - self._last > 0.25 and loss is not None:
            self._last = now
            phase = "warmup" if step < self.warmup else "measure"
            self.bar.set_postfix(phase=phase, loss=f"{float(loss):.4f}",
                                 samples_s=f"{self.global_batch / step_s:.1f}", refresh=False)

    def note(self, **values) -> None:
        if self.bar is not None:
            self.bar.write("  ".join(f"{k}={v:.4f}" for k, v in values.items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _probe_comm(adapter, batches, ctx) -> dict:
    """Extra, untimed steps under the collective counter (outside the window): one, or one
    period of a strategy that communicates every k steps (adapter.comm_probe_steps()). Adapters
    whose collectives bypass c10d (Horovod) report their own counts via comm_stats(). On gloo,
    the bytes the process wrote meanwhile (its sockets) are recorded as an independent check."""
    from ddlbench.comm_probe import CollectiveCounter, written_bytes

    steps = adapter.comm_probe_steps()
    adapter.comm_stats()  # reset the adapter's own counters, if it has any
    from ddlbench.topology import hosts_of, node_groups, node_of
    probe = CollectiveCounter(node_of(adapter.node_groups or node_groups(hosts_of(ctx))))
    written = written_bytes() if ctx.backend == "gloo" else None
    with probe:
        for _ in range(steps):
            adapter.train_step(next(batches))
        _sync(ctx.device)
    if written is not None:
        written = written_bytes() - written
    own = adapter.comm_stats()
    return {"source": "adapter" if own is not None else "c10d_dispatch",
            "counts": own if own is not None else probe.take(), "steps": steps, "written_bytes": written}


def _busy_probe(adapter, device) -> float | None:
    """Model-parallel adapters' busy time per step, after the window: the fastest of 3 runs of
    each pass the adapter hands over (adapter.busy_probe()), summed, x its repeats per step.
    None where the adapter has no such probe."""
    got = adapter.busy_probe()
    if got is None:
        return None
    passes, per_step = got
    total = 0.0
    for one in passes:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            one()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        total += best
    adapter.after_busy_probe()
    return total * per_step


def run(plan: Plan, ctx: RankContext, run_dir: Path, baseline_rss: int, threads: int) -> None:
    cfg, dims = plan.cfg, plan.dims
    commthreads.policy()     # a bad $DDLBENCH_COMM_THREADS fails here, not after the first step
    pipelined = dims.pp > 1  # stages send point to point: comm threads stay fair (ddlbench/commthreads.py)
    torch.manual_seed(cfg.run.seed)
    spec = models.build(cfg.model, ctx.device.type)
    tracking = RunTracker(ctx.device) if cfg.run.memory_tracker else contextlib.nullcontext()
    with tracking:   # run.memory_tracker: every storage from before setup to the end of the loop
        adapter = plan.adapter_cls(plan.options, ctx, dims)
        adapter.setup(spec.build, build_optimizer_factory(cfg.optim))
        adapter.mark_setup_done()
        if cfg.run.memory_tracker:
            tracking.label(adapter.model, adapter.optimizer)
        events.mark(run_dir, "model_ready", ctx.rank)
        dp_rank = adapter.dp_rank
        dataset = build_dataset(cfg.data, cfg.model, cfg.run.seed)
        batches, steps_per_epoch = batch_source(dataset, cfg, spec, dims, dp_rank, ctx.device)
        warmup, warnings = cfg.run.warmup_steps, []
        evaluate = None
        if cfg.run.epochs:  # quality mode: whole epochs, evaluation between steps
            total = cfg.run.epochs * steps_per_epoch
            if dataset.val.size:     # data.val_fraction=0: train only, nothing to evaluate
                evaluate = Evaluator(adapter, dataset, dims, dp_rank, ctx.device, steps_per_epoch, cfg.run.eval_every)
        else:
            total = warmup + cfg.run.measure_steps
        adapter.plan_steps(total, steps_per_epoch if cfg.run.epochs else None)
        fault = FaultInjector(cfg.fault, ctx.rank, run_dir)
        step_s: list[float] = []     # every step, warm-up included (eval pauses excluded)
        host_s: list[float] = []     # per step: previous step's end -> this rank calls train_step
        losses: list = []
        evals: list[dict] = []
        target = resolve_target(cfg.run.target, cfg.run.target_metric, cfg.run.target_vs_floor,
                                dataset.floor["loss"] if dataset else None)
        progress = _Progress(cfg.run.progress and ctx.rank == 0, total, warmup, dims.global_batch)
        stop.expose(step_s, losses, warmup)   # what a SIGUSR1 stop saves (ddlbench/launch/stop.py)

        from ddlbench.nvml import for_device
        gpu = for_device(ctx.device)       # NVML sampler thread (CUDA only): outside every step
        _sync(ctx.device)
        wall0 = time.perf_counter()
        if evaluate:
            evals.append({**evaluate(0), "wall_s": 0.0})
        t_prev = time.perf_counter()
        for step in range(total):
            if fault.active:
                fault.at_step(step)
            batch = next(batches)
            if step == 1 and cfg.run.memory_tracker:
                tracking.reset_peak()          # the steady state: the optimizer's state exists
            host_s.append(time.perf_counter() - t_prev)
            out = adapter.train_step(batch)
            if fault.active:
                fault.after_step(step)
            _sync(ctx.device)
            t = time.perf_counter()
            step_s.append(t - t_prev)
            if step == 0:
                first_step_end = time.time()   # start-up timeline; written after the loop
            if step == warmup:
                window_start = t_prev          # the measured window: start of the first measured step
            losses.append(out.loss)
            progress.update(step, out.loss, t - t_prev)
            t_prev = t
            if step == 0:    # the first step made the threads its collectives use; not part of any step
                comm_threads = commthreads.apply(p2p=pipelined)
                t_prev = time.perf_counter()
            if evaluate and evaluate.due(step + 1):
                evals.append({**evaluate(step + 1), "wall_s": time.perf_counter() - wall0})
                progress.note(val_loss=evals[-1]["loss"])
                if cfg.run.stop_at_target and reached(evals[-1][cfg.run.target_metric], target, cfg.run.target_metric):
                    break
                t_prev = time.perf_counter()  # evaluation is not part of any step
        wall_s = time.perf_counter() - wall0
    gpu_stats = gpu.stop() if gpu is not None else {"available": False, "reason": f"{ctx.device.type} run"}
    gpu_stats["steps"] = len(losses)
    unix_offset = time.time() - time.perf_counter()
    progress.close()
    if step_s:
        events.mark(run_dir, "first_step", ctx.rank, t=first_step_end)
    if warmup >= len(step_s):  # quality mode: fewer steps than warm-up (short epochs, early stop)
        warnings.append(f"run.warmup_steps {warmup} >= the {len(step_s)} steps trained; "
                        "timing statistics use the last step only")
        warmup = len(step_s) - 1

    memory = adapter.memory_stats()  # peaks of the training loop, before the probe step
    if cfg.run.memory_tracker:
        memory["tracker"] = {**tracking.result(), "steps": max(len(step_s) - 1, 0)}
        warnings.append("run.memory_tracker: every step ran under torch's MemTracker (a Python dispatch "
                        "mode): its step times and throughput are not comparable with other runs")
    objective = (final_objective(adapter, dataset, dims, dp_rank, ctx.device, cfg.optim, len(losses))
                 if cfg.run.final_objective else None)
    comm = _probe_comm(adapter, batches, ctx)
    if cfg.run.comm_profile and ctx.world_size > 1:
        from ddlbench.comm_time import profile_comm
        comm["time"] = profile_comm(adapter, batches, ctx.device, comm["steps"])
    fingerprint = adapter.param_fingerprint() if cfg.run.param_fingerprint else None
    adapter_stats = adapter.rank_stats()
    busy = _busy_probe(adapter, ctx.device)
    if busy is not None:
        adapter_stats["busy_s_per_step"] = busy
    local = {
        "rank": ctx.rank,
        "step_time_s": step_s[warmup:],
        "all_step_time_s": step_s,
        "host_time_s": host_s[warmup:],
        "window_unix_s": ([unix_offset + window_start, unix_offset + t_prev]
                          if len(step_s) > warmup and not cfg.run.epochs else None),
        "loss": [float("nan") if l is None else float(l) for l in losses],
        "memory": memory,
        "baseline_rss_bytes": baseline_rss,
        "comm": comm,
        "adapter_stats": adapter_stats,
        "gpu": gpu_stats,
        "hostname": platform.node(),
        "comm_threads": comm_threads if step_s else commthreads.apply(p2p=pipelined),
    }
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, local)
    if ctx.rank == 0:
        record = build_ok_record(plan, ctx, run_dir, spec, adapter, gathered, threads, wall_s)
        record["warnings"].extend(warnings)
        timeline = events.read(run_dir)
        record["startup_s"] = events.phases(timeline)
        record["env"]["rank_start_method"] = events.info(timeline, "agent_start", "start_method")
        if dataset is not None:
            fill_convergence(record, cfg, dataset, steps_per_epoch, evals, target, gathered)
            record["convergence"]["final_objective"] = objective
        if fingerprint is not None:
            record["final_params"] = {"fingerprint": fingerprint, "after_steps": len(losses) + comm["steps"] * (2 if "time" in comm else 1),
                                      "note": "[sum, sum of squares, sum of |x|, sum of x_i (i+1)/n over the row-major "
                                              "elements (order-sensitive)] per parameter after the "
                                              "training loop, the comm-probe steps and the comm-profile steps"}
        write_metrics_jsonl(run_dir, record, gathered)
        write_result(run_dir, record)
    adapter.teardown()
    dist.barrier()
