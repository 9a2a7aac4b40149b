"""Turn the per-rank series gathered after the window into the result record (rank 0 only)."""
from __future__ import annotations

import json
from pathlib import Path

from ddlbench.adapters.variant import model_state_theory
from ddlbench.machine.hardware import cuda_tf32_enabled, peak_dtype, peak_flops
from ddlbench.metrics.comm import FACTOR_NOTE, analytic_comm, comm_time, latest_issue, per_step, rank_wire_bytes
from ddlbench.metrics.convergence import eval_times, first_reached
from ddlbench.metrics.mfu import MfuError, mfu
from ddlbench.metrics.throughput import throughput
from ddlbench.metrics.timing import (
    global_step_times,
    mean_ignoring_missing,
    summarize,
    window_step_time,
    window_vs_median,
)
from ddlbench.rank.sections import (
    checkpoint_section,
    env_fields,
    flops_section,
    framework_fields,
    gpu_telemetry,
    moe_section,
    timing_section,
)
from ddlbench.record.results import Record, finite
from ddlbench.record.rundir import RunDir


def _global_losses(gathered: list) -> list[float]:
    steps = len(gathered[0]["loss"])
    return [mean_ignoring_missing([g["loss"][i] for g in gathered]) for i in range(steps)]


def _comm(gathered: list, world: int, params: int | None, analytic, backend: str) -> dict | None:
    per_rank = [g["comm"]["counts"] for g in gathered]
    if any(c is None for c in per_rank):
        return None
    steps = gathered[0]["comm"].get("steps", 1)
    rows = [per_step(c, steps) for c in per_rank]
    issued = {k: latest_issue([r[k].pop("issued") for r in rows if "issued" in r.get(k, {})])
              for k in sorted({k for r in rows for k, v in r.items() if "issued" in v})}
    kinds = sorted({k for r in rows for k in r})
    per_step_bytes = {k: max(r.get(k, {}).get("bytes", 0.0) for r in rows) for k in kinds}
    wire = [rank_wire_bytes(r, world, backend) for r in rows]
    written = [g["comm"].get("written_bytes") for g in gathered]
    out = {
        "per_step_bytes": per_step_bytes,
        "per_step_calls": {k: max(r.get(k, {}).get("calls", 0.0) for r in rows) for k in kinds},
        "per_rank": [{"rank": g["rank"], **r, "wire_bytes": w} for g, r, w in zip(gathered, rows, wire)],
        "source": gathered[0]["comm"]["source"], "probe_steps": steps,
        "note": "payload bytes per collective kind per step, over untimed steps after the window "
                "(probe_steps: one period of the strategy), max over ranks (all-gather: gathered "
                "size; reduce-scatter: input size)",
        "backend": backend, "wire_factors": FACTOR_NOTE.get(backend, FACTOR_NOTE["nccl"]),
        "wire_bytes_per_rank": max(wire),
        "wire_bytes_mean": sum(wire) / len(wire),
    }
    if all(w is not None for w in written):
        for row, w in zip(out["per_rank"], written):
            row["written_bytes"] = w / steps
        out["written_bytes_mean"] = sum(written) / len(written) / steps
        out["written_note"] = ("bytes each rank wrote to file descriptors during the probe steps "
                               "(/proc/self/io wchar: gloo's sockets), per step: an independent check "
                               "of wire_bytes_mean")
    grouped = {k: {} for k in kinds}
    for r in rows:
        for k, v in r.items():
            for size, b in (v.get("group_bytes") or {}).items():
                grouped[k][size] = max(grouped[k].get(size, 0.0), b)
    calls = {k: {} for k in kinds}
    for r in rows:
        for k, v in r.items():
            for size, c in (v.get("group_calls") or {}).items():
                calls[k][size] = max(calls[k].get(size, 0.0), c)
    if any(grouped.values()):
        out["per_step_bytes_by_group"] = {k: v for k, v in grouped.items() if v}
        out["per_step_calls_by_group"] = {k: v for k, v in calls.items() if v}
        out["group_note"] = ("'<ranks>@<nodes>': bytes (calls) per step in groups of that many ranks spanning "
                             "that many nodes")
    if issued:
        out["issued"] = issued
        out["issued_note"] = ("per kind, the messages of the last probe step in issue order as [headroom_s, bytes]: "
                              "seconds of the step's compute still to run when the library was handed the "
                              "message (its background thread sends it while backward goes on), the smallest "
                              "over ranks; bench project prices a link draining them in that order")
    out.update(analytic_comm(analytic, params, world, backend))
    times = [g["comm"].get("time") for g in gathered]
    if all(t is not None for t in times):
        out["time"] = comm_time(times, per_step_bytes, world)
        out["time_note"] = ("per step, mean over ranks and over the profiled periods (run.comm_profile_repeats "
                            "periods of the probe's steps, untimed, under torch.profiler, after the window): "
                            "time a collective ran (gloo: enqueue to completion, waiting for peers included), "
                            "the part overlapped with compute, the exposed part; *_spread: [fastest, median, "
                            "slowest] period; busbw = payload / time x nccl-tests factor (compare with "
                            "`bench commbench`)")
    return out


def build_ok_record(plan, ctx, run_dir: Path, spec, strategy, gathered: list, threads: int,
                    wall_s: float) -> Record:
    """The record of an ok run from every rank's series: each section by ddlbench/rank/sections.py."""
    from ddlbench.models.flops import train_flops_per_sample

    cfg, dims = plan.cfg, plan.dims
    record = Record.new(Path(run_dir).name, plan.raw, status="ok", precision=plan.cfg.run.precision)
    desc = strategy.describe()
    record.framework.update(framework_fields(plan, ctx, strategy, desc))

    step_times = global_step_times([g["step_time_s"] for g in gathered])
    stats = summarize(step_times)
    window_step = window_step_time([g["step_time_s"] for g in gathered])
    tp = throughput(dims.global_batch, window_step, dims.world_size, spec.tokens_per_sample)
    params = strategy.params
    recompute = plan.variant.ac_policy()
    flops = train_flops_per_sample(spec, recompute_blocks=recompute)
    tf32 = ctx.device.type == "cuda" and cuda_tf32_enabled(getattr(cfg.model, "arch", None))
    peak, peak_source = peak_flops(cfg.hardware, ctx.device, ctx.precision, threads, tf32)
    mfu_value = hfu_value = None
    if peak:
        try:
            mfu_value = mfu(flops["flops"], tp["samples_per_s"], dims.world_size, peak)
            hfu_value = mfu(flops["hardware_flops"], tp["samples_per_s"], dims.world_size, peak)
        except MfuError as exc:
            record.warnings.append(str(exc))
    else:
        record.warnings.append(f"mfu unavailable: {peak_source}")
    tp["samples_per_s_median_step"] = dims.global_batch / stats["median"] if stats["median"] > 0 else None

    record.model.update(params=params, tokens_per_sample=spec.tokens_per_sample,
                        native_config=spec.config, family=spec.family.name if spec.family else None)
    if flops["params"] and flops["params"]["active"] != flops["params"]["total"]:
        record.model["active_params"] = flops["params"]["active"]
        record.model["total_params"] = flops["params"]["total"]
    record.parallel = {**dims.as_dict(), **plan.choices}
    record.env, notes = env_fields(ctx, threads, gathered)
    record.warnings += notes
    steady = window_vs_median(window_step, stats, len(step_times))
    record.timing, stragglers, notes = timing_section(cfg, ctx.device.type, gathered, step_times, stats,
                                                      window_step, steady, wall_s)
    if stragglers is not None:
        record.sections["stragglers"] = stragglers
    record.warnings.extend(notes)
    record.throughput = tp
    record.memory = {
        "per_rank": [{"rank": g["rank"], **g["memory"], "baseline_rss_bytes": g["baseline_rss_bytes"]}
                     for g in gathered],
        "model_state_bytes_per_rank_theory": model_state_theory(
            plan.variant, dims, ctx.precision, params, cfg.optim.name, cfg.optim.momentum) if params else None,
        "note": "baseline_rss_bytes = peak RSS after imports, before the model is built",
    }
    analytic = plan.variant.analytic_comm(dims, ctx.precision, params or 0, strategy.per_node)
    record.comm = _comm(gathered, dims.world_size, params, analytic, ctx.backend)
    if any(g.get("moe") for g in gathered):
        record.sections["moe"] = moe_section(spec, strategy, dims, ctx.precision, gathered, record.comm)
    if any(g.get("adapter_stats") for g in gathered):
        record.sections["model_parallel"] = strategy.summarize_rank_stats(
            [g["adapter_stats"] for g in gathered], record.timing["per_rank_median_s"])
    if gathered[0].get("checkpoint"):
        record.sections["checkpoint"] = ck = checkpoint_section([g["checkpoint"] for g in gathered])
        failed = [s for s in ck["saves"] if s["errors"]]
        if failed:        # a failed save fails the save, never the run: said here and in the save's row
            record.warnings.append(f"run.checkpoint: {len(failed)} of {len(ck['saves'])} saves failed; the first at "
                                   f"step {failed[0]['step']}: {failed[0]['errors'][0]}")
    record.mfu = mfu_value
    record.sections["gpu"] = gpu_telemetry([g.get("gpu") for g in gathered], dims.global_batch)
    record.sections["flops"] = flops_section(flops, recompute, ctx, peak_dtype(ctx.device.type, ctx.precision, tf32),
                                             peak, peak_source, mfu_value, hfu_value, window_step, stats["median"],
                                             desc.get("native_config"), spec.tokens_per_sample)
    losses = _global_losses(gathered)
    record.convergence["train_loss"] = [[i, l] for i, l in enumerate(losses)]
    return record


def fill_convergence(record: Record, cfg, dataset, steps_per_epoch: int, evals: list[dict],
                     target, gathered: list) -> None:
    """Evaluations get `time_s`: training time so far (sum of global step times, i.e. max over
    ranks per step, warm-up included, evaluation pauses excluded)."""
    all_steps = global_step_times([g["all_step_time_s"] for g in gathered])
    for e, t in zip(evals, eval_times(all_steps, [e["step"] for e in evals])):
        e["time_s"] = t
    hit = first_reached(evals, target, cfg.run.target_metric)
    record.convergence.update(
        eval=evals, target=target, target_metric=cfg.run.target_metric,
        target_rule=("run.target x floor.loss" if cfg.run.target_vs_floor else "run.target"),
        time_to_target_s=hit["time_s"] if hit else None,
        epochs_to_target=hit["epoch"] if hit else None,
        steps_to_target=hit["step"] if hit else None,
        floor=dataset.floor,
        dataset={"name": dataset.name, "train_samples": dataset.train.size,
                 "val_samples": dataset.val.size, "steps_per_epoch": steps_per_epoch,
                 "epochs": cfg.run.epochs, **dataset.info},
        time_note="time_s = training time: sum of global step times (max over ranks), warm-up "
                  "included, evaluation excluded; wall_s includes evaluation",
    )


def write_metrics_jsonl(run_dir: Path, record: Record, gathered: list) -> None:
    """One line per step: global step time (max over ranks), global loss, per-rank times."""
    warmup = record.timing["warmup_steps"]
    gb = record.parallel["global_batch"]
    path = RunDir(run_dir).metrics
    with open(path, "w") as f:
        for step, loss in record.convergence["train_loss"]:
            row = {"step": step, "phase": "warmup" if step < warmup else "measure", "loss": loss}
            if step >= warmup:
                i = step - warmup
                t = record.timing["series_s"][i]
                row.update(step_time_s=t, samples_per_s=gb / t,
                           per_rank_step_time_s=[g["step_time_s"][i] for g in gathered])
            f.write(json.dumps(finite(row), allow_nan=False) + "\n")
