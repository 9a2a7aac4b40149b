"""Turn the per-rank series gathered after the window into the result record (rank 0 only)."""
from __future__ import annotations

import json
from pathlib import Path

from ddlbench.adapters.variant import model_state_theory
from ddlbench.machine import envinfo
from ddlbench.machine.hardware import cuda_tf32_enabled, peak_dtype, peak_flops
from ddlbench.metrics.comm import FACTOR_NOTE, analytic_comm, comm_time, latest_issue, per_step, rank_wire_bytes
from ddlbench.metrics.convergence import eval_times, first_reached
from ddlbench.metrics.mfu import FP8_OVER_BF16, MfuError, float8_share, float8_weighted_mfu, mfu
from ddlbench.metrics.step_split import gather_split
from ddlbench.metrics.stragglers import describe as describe_stragglers
from ddlbench.metrics.stragglers import find_stragglers
from ddlbench.metrics.throughput import throughput
from ddlbench.metrics.timing import (
    global_step_times,
    mean_ignoring_missing,
    summarize,
    window_step_time,
    window_vs_median,
)
from ddlbench.models import checkpointing
from ddlbench.record.results import Record, finite
from ddlbench.record.rundir import RunDir


def _global_losses(gathered: list) -> list[float]:
    steps = len(gathered[0]["loss"])
    return [mean_ignoring_missing([g["loss"][i] for g in gathered]) for i in range(steps)]


def causal_mfu(flops: dict, mfu_value) -> dict:
    """Both attention conventions (long context: attention dominates): `mfu` counts every T x T
    score (non-causal: torch's flop counter, PaLM's 12 L H Q T); `mfu_causal` the about half a
    causal kernel computes, scaled by the analytic count's causal / full ratio."""
    a = flops.get("analytic") or {}
    out = {"attention_convention": "mfu: full T x T attention scores (non-causal); mfu_causal: half of them (causal)"}
    if a.get("causal_train_per_sample") and a.get("train_per_sample"):
        ratio = a["causal_train_per_sample"] / a["train_per_sample"]
        out.update(causal_train_per_sample=flops["flops"] * ratio,
                   mfu_causal=mfu_value * ratio if mfu_value is not None else None)
    return out


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


def least_busy_pct(per_rank: list) -> float | None:
    """The lowest mean NVML utilisation over the ranks' GPUs, or None without telemetry."""
    utils = [((r or {}).get("utilization_pct") or {}).get("mean") for r in per_rank]
    return min(utils) if utils and all(u is not None for u in utils) else None


def gpu_telemetry(per_rank: list, global_batch: int) -> dict:
    """NVML per rank (ddlbench/machine/nvml.py) and the run's energy: joules summed over ranks' GPUs during
    the training loop, and per trained sample (global batch x steps)."""
    if not per_rank or not all(r and r.get("available") for r in per_rank):
        reasons = sorted({(r or {}).get("reason") or "no telemetry" for r in per_rank if not (r or {}).get("available")})
        return {"available": False, "reason": "; ".join(reasons), "per_rank": per_rank}
    energies = [r.get("energy_j") for r in per_rank]
    total = sum(energies) if all(e is not None for e in energies) else None
    windows = [r.get("window_energy_j") for r in per_rank]
    window = sum(windows) if all(e is not None for e in windows) else None
    measured = per_rank[0].get("measured_steps") or 0
    return {"available": True, "per_rank": per_rank, "energy_j": total, "window_energy_j": window,
            "energy_per_sample_j": window / (global_batch * measured) if window is not None and measured else None,
            "note": "sampled by NVML in a thread while the training loop ran; energy_j: the whole loop (warm-up "
                    "and compile included); window_energy_j and energy_per_sample_j: the measured window only "
                    "(each board's energy counter interpolated at the window's start and end, summed over ranks)"}


def build_ok_record(plan, ctx, run_dir: Path, spec, strategy, gathered: list, threads: int,
                    wall_s: float) -> Record:
    from ddlbench.adapters.optim import optimizer_impl
    from ddlbench.models.flops import train_flops_per_sample

    cfg, dims = plan.cfg, plan.dims
    measure = len(gathered[0]["step_time_s"])
    warmup = len(gathered[0]["all_step_time_s"]) - measure
    record = Record.new(Path(run_dir).name, plan.raw, status="ok", precision=plan.cfg.run.precision)
    desc = strategy.describe()
    native = desc.get("native_config")
    if isinstance(native, dict):
        native["mixed_precision"] = strategy.precision.describe()
    record.framework.update(version=desc.get("version"), native_config=native,
                               taxonomy=plan.variant.taxonomy(),
                               grad_reduce_dtype=plan.variant.grad_reduce_dtype(ctx.precision),
                               # a framework that steps its own optimizer says so (DeepSpeedCPUAdam)
                               optimizer_impl=desc.get("optimizer_impl") or optimizer_impl(cfg.optim.impl,
                                                                                           ctx.device.type),
                               precision_recipe={**strategy.precision.recipe(),
                                                 "grad_reduce": plan.variant.grad_reduce_dtype(ctx.precision),
                                                 **({"matmuls": FLOAT8_MATMULS} if cfg.run.float8 else {})})

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

    steady = window_vs_median(window_step, stats, len(step_times))
    tp["samples_per_s_median_step"] = dims.global_batch / stats["median"] if stats["median"] > 0 else None

    record.model.update(params=params, tokens_per_sample=spec.tokens_per_sample,
                           native_config=spec.config, family=spec.family.name if spec.family else None)
    if flops["params"] and flops["params"]["active"] != flops["params"]["total"]:
        record.model["active_params"] = flops["params"]["active"]
        record.model["total_params"] = flops["params"]["total"]
    record.parallel = {**dims.as_dict(), **plan.choices}
    record.env = envinfo.capture(ctx.device, ctx.backend, threads)
    record.env["hostnames"] = sorted({g["hostname"] for g in gathered})
    record.env["rank_hosts"] = [g["hostname"] for g in gathered]     # rank r ran on rank_hosts[r]
    if any(g.get("device_netns") for g in gathered):     # bench cluster with device namespaces
        record.env["rank_devices"] = [g.get("device_netns") for g in gathered]
    record.env["network"] = envinfo.network_ran_on()
    from ddlbench.rank import malloc
    record.env["malloc"] = malloc.state()      # rank 0's; every CPU rank applies the same
    record.env["comm_threads"] = {"policy": gathered[0]["comm_threads"]["policy"],
                                     "per_rank": [g["comm_threads"]["threads"] for g in gathered]}
    record.warnings += sorted({g["comm_threads"]["note"] for g in gathered if g["comm_threads"].get("note")})
    record.timing = {
        "warmup_steps": warmup, "measured_steps": measure,
        "step_time_s": {k: stats[k] for k in ("median", "mean", "p10", "p90", "std", "min", "max")},
        "series_s": step_times,
        "per_rank_median_s": [summarize(g["step_time_s"])["median"] for g in gathered],
        "wall_s": wall_s,
        "window_step_s": window_step,
        "window_vs_median": steady,
        "per_rank_window_s": [sum(g["step_time_s"]) for g in gathered],
        "per_rank_window_unix_s": [g.get("window_unix_s") for g in gathered],
        "throughput_rule": "throughput = global_batch / window_step_s; window_step_s = max over ranks of the "
                           "rank's measured window (its step times summed) / measured steps. step_time_s "
                           "(per step, max over ranks) is the distribution, not the throughput",
        "clock": "time.perf_counter at step boundaries" + (
            ", after torch.cuda.current_stream().synchronize() (the compute stream; communication left in "
            "flight on other streams is not waited for)" if ctx.device.type == "cuda" else ""),
    }
    if all(g.get("issue_time_s") for g in gathered):
        issue = max(summarize(g["issue_time_s"])["median"] for g in gathered)
        record.timing["issue_time_s_median"] = issue
        record.timing["launch_bound"] = launch_bound(issue, stats["median"], ctx.device.type,
                                                     least_busy_pct([g.get("gpu") for g in gathered]))
    if all(g.get("host_events") for g in gathered):
        from ddlbench.rank.hostevents import slowest_step
        per_rank = [g["host_events"] for g in gathered]
        record.timing["host_events"] = {"per_rank": per_rank, "gc_policy": cfg.run.gc,   # ddlbench/rank/gcpolicy.py
                                        "slowest_step": slowest_step(step_times, stats["median"], per_rank)}
    if gathered[0].get("window_rule"):     # run.min_window_s: agreed over ranks, so rank 0's is every rank's
        record.timing["window_rule"] = gathered[0]["window_rule"]
    if gathered[0].get("warmup_rule"):     # run.warmup_max_steps: agreed over ranks, as above
        record.timing["warmup_rule"] = gathered[0]["warmup_rule"]
    if cfg.run.step_split:
        record.timing["step_split"] = gather_split([g.get("step_split") for g in gathered])
    if all("host_time_s" in g for g in gathered):
        record.timing["per_rank_host_median_s"] = [summarize(g["host_time_s"])["median"] for g in gathered]
        record.sections["stragglers"] = find_stragglers([g["host_time_s"] for g in gathered], stats["median"])
        record.warnings.extend(describe_stragglers(record.sections["stragglers"]))
    record.throughput = tp
    optim = cfg.optim
    record.memory = {
        "per_rank": [{"rank": g["rank"], **g["memory"], "baseline_rss_bytes": g["baseline_rss_bytes"]}
                     for g in gathered],
        "model_state_bytes_per_rank_theory": model_state_theory(
            plan.variant, dims, ctx.precision, params, optim.name, optim.momentum) if params else None,
        "note": "baseline_rss_bytes = peak RSS after imports, before the model is built",
    }
    analytic = plan.variant.analytic_comm(dims, ctx.precision, params or 0, strategy.per_node)
    record.comm = _comm(gathered, dims.world_size, params, analytic, ctx.backend)
    if any(g.get("moe") for g in gathered):
        from ddlbench.models.moe import all_to_all_payload, load_summary
        layout = strategy.moe_record()
        moe = {**load_summary([g["moe"] for g in gathered if g.get("moe")], layout["ep"], dims.tp),
               "experts_implementation": spec.config.get("experts_implementation"),
               "routing": "dropless (transformers' top-k router: no capacity, no dropped tokens)", **layout}
        rows = moe.pop("dispatch_rows_per_microbatch", None) or spec.tokens_per_sample * dims.micro_batch * spec.top_k
        if layout["ep"] > 1 and record.comm:
            moe["all_to_all_payload_bytes_per_step"] = record.comm["per_step_bytes"].get("all_to_all")
            moe["all_to_all_payload_bytes_per_step_analytic"] = all_to_all_payload(
                len(moe["tokens_per_expert"]), dims.grad_accum * rows, 1, spec.config.get("hidden_size"),
                4 if ctx.precision == "fp32" else 2)
            moe["all_to_all_note"] = ("payload: each rank's all-to-all inputs per step (dispatch and combine in forward, "
                                      "their gradients in backward), the busiest rank; analytic: 4 x layers x rows x "
                                      "hidden x bytes, rows = tokens x top_k with uniform routing (a capacity-padded "
                                      "dispatch: experts x capacity), the token counts' exchange left out")
        record.sections["moe"] = moe
    if any(g.get("adapter_stats") for g in gathered):
        record.sections["model_parallel"] = strategy.summarize_rank_stats(
            [g["adapter_stats"] for g in gathered], record.timing["per_rank_median_s"])
    record.mfu = mfu_value
    record.sections["gpu"] = gpu_telemetry([g.get("gpu") for g in gathered], dims.global_batch)
    measured, measured_source = measured_peak(ctx.device, peak_dtype(ctx.device.type, ctx.precision, tf32),
                                              peak, peak_source)
    record.sections["flops"] = {"train_per_sample": flops["flops"], "method": flops["method"],
                       "palm_train_per_sample": flops["palm_flops"],
                       "analytic": flops["analytic"],
                       "hardware_train_per_sample": flops["hardware_flops"],
                       "recompute": checkpointing.recompute_label(recompute),
                       "hfu": hfu_value, "peak_dtype": peak_dtype(ctx.device.type, ctx.precision, tf32),
                       "peak_per_device": peak, "peak_source": peak_source,
                       "measured_peak_per_device": measured, "measured_peak_source": measured_source,
                       "mfu_on_measured_peak": rebase_mfu(mfu_value, peak, measured),
                       "mfu_median_step": (mfu_value * window_step / stats["median"]
                                           if mfu_value is not None and stats["median"] > 0 else None),
                       "note": "mfu = train_per_sample x samples/s / (devices x peak); hfu the same with "
                               "hardware_train_per_sample (recomputed forwards included)",
                       **causal_mfu(flops, mfu_value)}
    f8 = (native or {}).get("float8") if isinstance(native, dict) else None
    if isinstance(f8, dict) and f8.get("converted_params") and mfu_value is not None and spec.tokens_per_sample:
        share = float8_share(f8["converted_params"], spec.tokens_per_sample, flops["flops"])
        record.sections["flops"].update(
            float8_share=share, mfu_float8_weighted=float8_weighted_mfu(mfu_value, share),
            float8_note=(f"mfu is on the {record.sections['flops']['peak_dtype']} peak although {share:.1%} of the "
                         f"FLOPs ran as float8 matmuls; mfu_float8_weighted counts those at the fp8 peak "
                         f"({FP8_OVER_BF16:g}x bf16's): ddlbench/metrics/mfu.py"))
    losses = _global_losses(gathered)
    record.convergence["train_loss"] = [[i, l] for i, l in enumerate(losses)]
    return record


FLOAT8_MATMULS = ("float8 in the converted linear layers (torchao Float8Linear: e4m3 inputs and weights, e5m2 "
                  "output gradients, tensorwise dynamic scaling)")
LAUNCH_BOUND = 0.9
DEVICE_BUSY = 80.0    # % of the time NVML saw a kernel running: below it the GPU sat idle between kernels


def launch_bound(issue_s: float, step_s: float, device_type: str, device_busy_pct: float | None = None) -> dict:
    """Whether the host's issuing of a step is what sets its pace. On CUDA train_step returns once
    its kernels are queued, so an issue time close to the step time (>= LAUNCH_BOUND of it) says
    the host was busy the whole step; but a framework that waits for the device inside its step
    (DeepSpeed's engine does) shows the same. The device's own time decides: launch-bound only
    where the GPU was also idle (NVML utilisation < DEVICE_BUSY %, slowest rank's). Without NVML
    a high issue time is not enough to say (None). On CPU the work runs as it is issued (None).
    Checked against the H200 records of 2026-11-26: DeepSpeed ZeRO 0-3 issue 0.96-1.00 of the step
    at 88-91% utilisation (not launch-bound); FSDP2 CPU offload 1.00 at 51% (host-bound: flagged)."""
    ratio = issue_s / step_s if step_s > 0 else None
    if device_type != "cuda" or ratio is None:
        value = None
    elif ratio < LAUNCH_BOUND:
        value = False
    else:
        value = None if device_busy_pct is None else device_busy_pct < DEVICE_BUSY
    return {"value": value, "issue_over_step": ratio, "device_busy_pct": device_busy_pct,
            "rule": f"CUDA: launch-bound when the median time to issue a step (train_step called -> returned, "
                    f"before the sync; slowest rank) >= {LAUNCH_BOUND:g} x the median step time and the GPU was "
                    f"busy < {DEVICE_BUSY:g}% of the loop (NVML utilisation, least busy rank); high issue time "
                    f"without NVML: unknown"}


def measured_peak(device, key: str, peak, peak_source: str):
    """(FLOP/s, source) of the matmul peak measured on this device, beside the datasheet's: on a
    GPU the cached CUDA-event probe (ddlbench.machine.hardware.measured_gpu_peak); on CPU the probe is
    the only peak MFU has."""
    if device.type != "cuda":
        return peak, peak_source
    from ddlbench.machine.hardware import measured_gpu_peak
    try:
        return measured_gpu_peak(device, key)
    except RuntimeError as exc:      # a probe that fails leaves the datasheet MFU as it is
        return None, f"not measured: {exc}"[:200]


def rebase_mfu(mfu_value, peak, measured):
    """MFU on the measured peak: the same FLOPs over the peak this device reached."""
    if mfu_value is None or not peak or not measured:
        return None
    return mfu_value * peak / measured


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
