"""The ONLY timed training loop.

Warm-up steps, then measured steps (or, with run.epochs, whole epochs with evaluations between
steps: ddlbench/rank/quality.py). Each rank records its own step times (boundary to
boundary; device-synchronised on GPU) and losses; nothing is communicated inside the window
beyond what the framework itself does. After the window the per-rank series are gathered once
and rank 0 writes the result (ddlbench/rank/collect.py).
"""
from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ddlbench import models
from ddlbench.adapters.base import CountsOwnCollectives, ModelParallel, Periodic, RankContext, param_fingerprint
from ddlbench.adapters.common import loop_peaks, setup_peaks
from ddlbench.adapters.optim import build_optimizer_factory
from ddlbench.cluster import device_task
from ddlbench.comm import threads as commthreads
from ddlbench.lifecycle import events, stop
from ddlbench.metrics.convergence import reached, resolve_target
from ddlbench.metrics.recovery import recovery, recovery_warning
from ddlbench.metrics.step_split import StepSplit
from ddlbench.metrics.timing import global_step_times
from ddlbench.models.datasets import build_dataset
from ddlbench.planning.config import Plan
from ddlbench.rank import hostevents, pace
from ddlbench.rank.collect import build_ok_record, fill_convergence, write_metrics_jsonl
from ddlbench.rank.faults import FaultInjector
from ddlbench.rank.gcpolicy import GcPolicy
from ddlbench.rank.memtrack import RunTracker
from ddlbench.rank.progress import Progress
from ddlbench.rank.quality import Evaluator, batch_source, final_objective

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


def _probe_comm(strategy, batches, ctx) -> dict:
    """Extra, untimed steps under the collective counter (outside the window): one, or one
    period of a strategy that communicates every k steps (Periodic.comm_probe_steps). Strategies
    whose collectives bypass c10d (Horovod) report their own counts (CountsOwnCollectives). On
    gloo, the bytes the process wrote meanwhile (its sockets) are recorded as an independent check."""
    from ddlbench.comm.probe import CollectiveCounter, written_bytes
    from ddlbench.comm.topology import hosts_of, node_groups, node_of

    steps = strategy.comm_probe_steps() if isinstance(strategy, Periodic) else 1
    own = isinstance(strategy, CountsOwnCollectives)
    if own:
        strategy.comm_stats()  # reset the strategy's own counters
    probe = CollectiveCounter(node_of(strategy.node_groups or node_groups(hosts_of(ctx))))
    written = written_bytes() if ctx.backend == "gloo" else None
    with probe:
        for _ in range(steps):
            strategy.train_step(next(batches))
        _sync(ctx.device)
    if written is not None:
        written = written_bytes() - written
    return {"source": "adapter" if own else "c10d_dispatch",
            "counts": strategy.comm_stats() if own else probe.take(), "steps": steps, "written_bytes": written}


def _busy_probe(strategy, device) -> float | None:
    """Model-parallel strategies' busy time per step, after the window: the fastest of 3 runs of
    each pass the strategy hands over (ModelParallel.busy_probe), summed, x its repeats per step.
    None where the strategy has no such probe."""
    got = strategy.busy_probe() if isinstance(strategy, ModelParallel) else None
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
    strategy.after_busy_probe()
    return total * per_step


@dataclass
class Setup:
    """What the run trains and measures with, made before the loop (not timed)."""
    strategy: object
    spec: object
    dataset: object
    batches: object
    steps_per_epoch: int | None
    total: int                      # steps to train
    evaluate: Evaluator | None      # quality mode with a validation split
    target: float | None
    peaks: dict                     # setup's memory peaks
    saves: object = None            # run.checkpoint: ddlbench/rank/saves.py


@dataclass
class Window:
    """What the timed loop leaves on this rank, read after it."""
    step_s: list[float] = field(default_factory=list)   # every step, warm-up included (eval pauses excluded)
    host_s: list[float] = field(default_factory=list)   # per step: previous step's end -> train_step called
    issue_s: list[float] = field(default_factory=list)  # per step: train_step called -> returned (before the sync)
    losses: list = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    start: float | None = None      # perf_counter at the start of the first measured step
    end: float | None = None        # perf_counter at the end of the last step
    first_step_end: float | None = None   # time.time() at the end of step 0 (the start-up timeline)
    comm_threads: dict | None = None      # what commthreads.apply did after step 0
    gpu: dict = field(default_factory=dict)   # NVML's telemetry over the loop
    step_split: dict | None = None        # run.step_split: forward / backward / optimizer (metrics/step_split.py)
    host_events: dict | None = None       # GC and allocator retries in the window (ddlbench/rank/hostevents.py)
    window_rule: dict | None = None       # run.min_window_s: how the window's length was set (metrics/window.py)
    warmup_steps: int = 0                 # warm-up as it ran (run.warmup_max_steps: until settled)
    warmup_rule: dict | None = None       # run.warmup_max_steps: where warm-up ended and why (metrics/warmup.py)


def run(plan: Plan, ctx: RankContext, run_dir: Path, baseline_rss: int, threads: int) -> None:
    """set up -> the timed loop -> the probes after the window -> gather; rank 0 writes the result."""
    cfg = plan.cfg
    commthreads.policy()     # a bad $DDLBENCH_COMM_THREADS fails here, not after the first step
    torch.manual_seed(cfg.run.seed)
    spec = models.build(cfg.model, ctx.device.type)
    cap = int(cfg.run.device_memory_gb * 2**30) if cfg.run.device_memory_gb and ctx.device.type == "cpu" else None
    tracking = RunTracker(ctx.device, cap) if cfg.run.memory_tracker or cap else contextlib.nullcontext()
    with tracking:   # run.memory_tracker: every storage from before setup to the end of the loop
        setup = set_up(plan, ctx, run_dir, spec, tracking)
        window = train(plan, ctx, run_dir, setup, tracking)
    warnings: list[str] = []
    warmup = window.warmup_steps
    if warmup >= len(window.step_s):  # quality mode: fewer steps than warm-up (short epochs, early stop)
        warnings.append(f"run.warmup_steps {warmup} >= the {len(window.step_s)} steps trained; "
                        "timing statistics use the last step only")
        warmup = len(window.step_s) - 1
    local, probes = after_window(plan, ctx, setup, window, warmup, tracking, warnings, run_dir)
    local["baseline_rss_bytes"] = baseline_rss
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, local)
    if ctx.rank == 0:
        write_record(plan, ctx, run_dir, setup, window, gathered, probes, threads, warnings)
    setup.strategy.teardown()
    dist.barrier()


def set_up(plan: Plan, ctx: RankContext, run_dir: Path, spec, tracking) -> Setup:
    """The strategy built and set up (its memory peaks kept), the data, the evaluator, the steps."""
    cfg, dims = plan.cfg, plan.dims
    strategy = plan.variant.strategy_class()(plan.variant, ctx, dims)
    strategy.setup(spec.build, build_optimizer_factory(cfg.optim, ctx.device.type))
    peaks = setup_peaks(ctx.device)
    if isinstance(tracking, RunTracker):
        tracking.label(strategy.model, strategy.optimizer)
    events.mark(run_dir, "model_ready", ctx.rank)
    saves, start = None, 0
    if cfg.run.checkpoint.every or cfg.run.checkpoint.resume_from:
        from ddlbench.rank.saves import Saves
        saves = Saves(cfg, strategy, run_dir, ctx.rank)
        start = saves.resume(cfg.run.checkpoint.resume_from)   # a restarted attempt: the newest complete save
    dataset = build_dataset(cfg.data, cfg.model, cfg.run.seed)
    batches, steps_per_epoch = batch_source(dataset, cfg, spec, dims, strategy.dp_rank, ctx.device, start)
    evaluate = None
    if cfg.run.epochs:  # quality mode: whole epochs, evaluation between steps
        total = cfg.run.epochs * steps_per_epoch
        if dataset.val.size:     # data.val_fraction=0: train only, nothing to evaluate
            evaluate = Evaluator(strategy, dataset, dims, strategy.dp_rank, ctx.device, steps_per_epoch,
                                 cfg.run.eval_every)
    else:
        total = cfg.run.warmup_steps + cfg.run.measure_steps
    if isinstance(strategy, Periodic):
        strategy.plan_steps(total, steps_per_epoch if cfg.run.epochs else None)
    target = resolve_target(cfg.run.target, cfg.run.target_metric, cfg.run.target_vs_floor,
                            dataset.floor["loss"] if dataset else None)
    return Setup(strategy, spec, dataset, batches, steps_per_epoch, total, evaluate, target, peaks, saves)


def train(plan: Plan, ctx: RankContext, run_dir: Path, setup: Setup, tracking) -> Window:
    """THE timed loop: step boundaries by perf_counter after the device sync; nothing else inside."""
    cfg, strategy, evaluate = plan.cfg, setup.strategy, setup.evaluate
    warmup = cfg.run.warmup_steps
    fault = FaultInjector(cfg.fault, ctx.rank, run_dir)
    w = Window()
    progress = Progress(cfg.run.progress and ctx.rank == 0, setup.total, warmup, plan.dims.global_batch)
    stop.expose(w.step_s, w.losses, warmup)   # what a SIGUSR1 stop saves (ddlbench/lifecycle/stop.py)
    from ddlbench.machine.nvml import for_device
    gpu = for_device(ctx.device)       # NVML sampler thread (CUDA only): outside every step
    split = StepSplit(strategy.model, ctx.device) if cfg.run.step_split else None
    _sync(ctx.device)
    retries0 = hostevents.alloc_retries(ctx.device)
    collector = GcPolicy(cfg.run.gc, cfg.run.gc_every)   # what the cyclic GC may do in a step (gcpolicy.py)
    collector.before_loop()
    collections = hostevents.GcClock().start()
    wall0 = time.perf_counter()
    if evaluate:
        w.evals.append({**evaluate(0), "wall_s": 0.0})
    t_prev = time.perf_counter()
    step = -1
    settling = cfg.run.warmup_max_steps is not None and not cfg.run.epochs
    while step + 1 < setup.total:      # setup.total may grow in and after the warm-up (run.warmup_max_steps, min_window_s)
        step += 1
        if fault.active:
            fault.at_step(step)
        batch = next(setup.batches)
        if step == 1 and isinstance(tracking, RunTracker):
            tracking.reset_peak()          # the steady state: the optimizer's state exists
        collector.in_step(step)
        t_issue = time.perf_counter()
        w.host_s.append(t_issue - t_prev)
        if split and step >= warmup:
            split.begin()
        out = strategy.train_step(batch)
        if split and step >= warmup:
            split.end()
        w.issue_s.append(time.perf_counter() - t_issue)
        if fault.active:
            fault.after_step(step)
        _sync(ctx.device)
        t = time.perf_counter()
        w.step_s.append(t - t_prev)
        if step == 0:
            w.first_step_end = time.time()   # the start-up timeline's first_step (marked below, outside the step)
        if step == warmup:
            w.start = t_prev                 # the measured window: start of the first measured step
        w.losses.append(out.loss)
        progress.update(step, out.loss, t - t_prev)
        if setup.saves:
            setup.saves.after_step(step, warmup, t, t - t_prev)
        t_prev = w.end = t
        if setup.saves and setup.saves.due(step, warmup):    # between two steps: no step's time holds it
            setup.saves.save(step)
            t_prev = time.perf_counter()
        if step == 0:    # the first step made the threads its collectives use and the optimizer's
            w.comm_threads = commthreads.apply(p2p=plan.dims.pp > 1)   # state; not part of any step
            collections.stop()
            collector.after_first_step()
            collections.start()
            events.mark(run_dir, "first_step", ctx.rank, t=w.first_step_end)
            t_prev = time.perf_counter()
        if step == warmup - 1 and settling:     # after a warm-up step, outside every step: settled on every rank?
            w.warmup_rule = pace.settle(w.step_s, warmup, cfg.run.warmup_steps, cfg.run.warmup_max_steps, ctx.world_size)
            if w.warmup_rule["stopped"] is None:   # one more warm-up step (a strategy with phases is told)
                warmup, setup.total = warmup + 1, setup.total + 1
                pace.replan(setup)
                stop.expose(w.step_s, w.losses, warmup)
                progress.resize(setup.total, warmup)
            t_prev = time.perf_counter()
        if step == warmup - 1 and cfg.run.min_window_s:   # after the warm-up, outside the window
            w.window_rule = pace.size_window(setup, cfg, warmup, w.step_s[-1], ctx.world_size)
            progress.resize(setup.total)
            t_prev = time.perf_counter()
        if evaluate and evaluate.due(step + 1):
            w.evals.append({**evaluate(step + 1), "wall_s": time.perf_counter() - wall0})
            progress.note(val_loss=w.evals[-1]["loss"])
            if cfg.run.stop_at_target and reached(w.evals[-1][cfg.run.target_metric], setup.target,
                                                  cfg.run.target_metric):
                break
            t_prev = time.perf_counter()  # evaluation is not part of any step
    w.wall_s = time.perf_counter() - wall0
    w.warmup_steps = warmup
    if setup.saves:      # every save durable before anything else: never abandoned
        setup.saves.finish()
    retries = hostevents.alloc_retries(ctx.device)
    w.host_events = hostevents.summary(collections.stop(), None if cfg.run.epochs else w.start, w.step_s[warmup:],
                                       None if retries is None else retries - retries0)
    w.host_events["gc_policy"] = collector.after_loop()
    progress.close()
    w.gpu = (gpu.stop(window=(w.start, w.end)) if gpu is not None
             else {"available": False, "reason": f"{ctx.device.type} run"})
    w.gpu["steps"] = len(w.losses)
    w.gpu["measured_steps"] = max(len(w.losses) - warmup, 0) if w.start is not None else 0
    w.step_split = split.result() if split else None   # after the last step's sync: the events are done
    return w


def after_window(plan: Plan, ctx: RankContext, setup: Setup, w: Window, warmup: int, tracking,
                 warnings: list[str], run_dir: Path) -> tuple[dict, dict]:
    """Untimed, after the window: the loop's memory peaks, then the probes (final objective, the
    collectives of one more step, their time, the parameters' fingerprint, model-parallel busy
    time, run.trace's profiled step). Returns (this rank's series and facts to gather, rank-local results rank 0 records)."""
    cfg, strategy = plan.cfg, setup.strategy
    memory = loop_peaks(ctx.device, setup.peaks)  # peaks of the training loop, before the probe step
    if isinstance(tracking, RunTracker):
        memory["tracker"] = {**tracking.result(), "steps": max(len(w.step_s) - 1, 0)}
        why = "run.memory_tracker" if cfg.run.memory_tracker else "run.device_memory_gb on a CPU (the cap is enforced by it)"
        warnings.append(f"{why}: every step ran under torch's MemTracker (a Python dispatch "
                        "mode): its step times and throughput are not comparable with other runs")
    objective = (final_objective(strategy, setup.dataset, plan.dims, strategy.dp_rank, ctx.device, cfg.optim,
                                 len(w.losses)) if cfg.run.final_objective else None)
    comm = _probe_comm(strategy, setup.batches, ctx)
    if cfg.run.comm_profile and ctx.world_size > 1:
        from ddlbench.comm.exposed import profile_comm
        comm["time"] = profile_comm(strategy, setup.batches, ctx.device, comm["steps"], cfg.run.comm_profile_repeats)
    fingerprint = param_fingerprint(strategy) if cfg.run.param_fingerprint else None
    adapter_stats = strategy.rank_stats() if isinstance(strategy, ModelParallel) else {}
    busy = _busy_probe(strategy, ctx.device)
    if busy is not None:
        adapter_stats["busy_s_per_step"] = busy
    traced = None
    if cfg.run.trace:     # last: one more step, so nothing above sees its update
        from ddlbench.comm.exposed import trace_step
        traced = trace_step(strategy, setup.batches, ctx.device, run_dir, ctx.rank)
    unix_offset = time.time() - time.perf_counter()
    local = {
        "rank": ctx.rank,
        "step_time_s": w.step_s[warmup:],
        "all_step_time_s": w.step_s,
        "host_time_s": w.host_s[warmup:],
        "issue_time_s": w.issue_s[warmup:],
        "step_split": w.step_split,
        "window_unix_s": ([unix_offset + w.start, unix_offset + w.end]
                          if len(w.step_s) > warmup and not cfg.run.epochs else None),
        "loss": [float("nan") if loss is None else float(loss) for loss in w.losses],
        "memory": memory,
        "comm": comm,
        "adapter_stats": adapter_stats,
        "gpu": w.gpu,
        "hostname": platform.node(),
        "device_netns": os.environ.get(device_task.INSIDE),   # bench cluster's device namespace, where it has them
        "comm_threads": w.comm_threads if w.step_s else commthreads.apply(p2p=plan.dims.pp > 1),
        "trace": traced,
        "moe": _router_stats(strategy),
        "host_events": w.host_events,
        "window_rule": w.window_rule,
        "warmup_rule": w.warmup_rule,
        "checkpoint": setup.saves.facts(w.step_s[warmup:], w.step_s[0] if w.step_s else None) if setup.saves else None,
    }
    return local, {"objective": objective, "fingerprint": fingerprint, "comm_steps": comm["steps"],
                   "comm_profiled": "time" in comm}


def _router_stats(strategy) -> dict | None:
    """An MoE model's tokens per expert and auxiliary loss on this rank (ddlbench/models/moe.py)."""
    from ddlbench.models.moe import find_router_stats
    stats = find_router_stats(strategy.model) if isinstance(strategy.model, torch.nn.Module) else None
    return stats.take() if stats is not None else None


def compile_time(gathered: list) -> dict:
    """run.compile: torch.compile runs inside the first (warm-up) step; its cost is that step less a
    measured step (max over ranks of the first step, median of the measured ones)."""
    first = max(g["all_step_time_s"][0] for g in gathered if g["all_step_time_s"])
    steady = sorted(max(s) for s in zip(*(g["step_time_s"] for g in gathered)))
    median = steady[len(steady) // 2] if steady else 0.0
    return {"compile_s": max(0.0, first - median)}


def write_record(plan: Plan, ctx: RankContext, run_dir: Path, setup: Setup, w: Window, gathered: list,
                 probes: dict, threads: int, warnings: list[str]) -> None:
    """Rank 0: the record from every rank's series (ddlbench/rank/collect.py), metrics.jsonl, result.json."""
    record = build_ok_record(plan, ctx, run_dir, setup.spec, setup.strategy, gathered, threads, w.wall_s)
    timeline = events.read(run_dir)
    # what the launcher noted before this attempt started (ranks that did not form a group, killed)
    record.warnings[:0] = events.notes(timeline)
    record.warnings.extend(warnings)
    more = record.sections
    more["startup_s"] = events.phases(timeline)
    more["recovery"] = recovery(timeline, global_step_times([g["all_step_time_s"] for g in gathered]))
    record.warnings += recovery_warning(more["recovery"])
    if plan.cfg.run.compile:   # also where the launch has no start-up timeline (Horovod's starter)
        more["startup_s"] = {**(more["startup_s"] or {}), **compile_time(gathered)}
    record.env["rank_start_method"] = events.info(timeline, "agent_start", "start_method")
    if setup.dataset is not None:
        fill_convergence(record, plan.cfg, setup.dataset, setup.steps_per_epoch, w.evals, setup.target, gathered)
        record.convergence["final_objective"] = probes["objective"]
    if probes["fingerprint"] is not None:
        more["final_params"] = {
            "fingerprint": probes["fingerprint"],
            "after_steps": len(w.losses) + probes["comm_steps"] * (1 + (plan.cfg.run.comm_profile_repeats
                                                                        if probes["comm_profiled"] else 0)),
            "note": "[sum, sum of squares, sum of |x|, sum of x_i (i+1)/n over the row-major elements "
                    "(order-sensitive)] per parameter after the training loop, the comm-probe steps and the "
                    "comm-profile steps"}
    if any(g.get("trace") for g in gathered):
        more["trace"] = {"per_rank": [g.get("trace") for g in gathered],
                         "note": "one training step after the window and every probe, under torch.profiler "
                                 "(run.trace): not timed, not in any figure above"}
    write_metrics_jsonl(run_dir, record, gathered)
    record.write(run_dir)
