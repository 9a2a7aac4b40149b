"""The sections of an ok run's record that rank 0 builds from the gathered per-rank series
(ddlbench/rank/collect.py puts them together): the framework's settings, the environment, timing,
Mixture-of-Experts routing, FLOPs and MFU, GPU telemetry."""
from __future__ import annotations

from ddlbench.machine import envinfo
from ddlbench.metrics.mfu import FP8_OVER_BF16, float8_share, float8_weighted_mfu
from ddlbench.metrics.step_split import gather_split
from ddlbench.metrics.stragglers import describe as describe_stragglers
from ddlbench.metrics.stragglers import find_stragglers
from ddlbench.metrics.timing import summarize
from ddlbench.models import checkpointing

FLOAT8_MATMULS = ("float8 in the converted linear layers (torchao Float8Linear: e4m3 inputs and weights, e5m2 "
                  "output gradients, tensorwise dynamic scaling)")
LAUNCH_BOUND = 0.9
DEVICE_BUSY = 80.0    # % of the time NVML saw a kernel running: below it the GPU sat idle between kernels


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


def framework_fields(plan, ctx, strategy, desc: dict) -> dict:
    """result.json's `framework` beyond its name: version, the native config it really used, the
    precision recipe, the optimizer implementation."""
    from ddlbench.adapters.optim import optimizer_impl
    cfg = plan.cfg
    native = desc.get("native_config")
    if isinstance(native, dict):
        native["mixed_precision"] = strategy.precision.describe()
    grad_reduce = plan.variant.grad_reduce_dtype(ctx.precision)
    return dict(version=desc.get("version"), native_config=native, taxonomy=plan.variant.taxonomy(),
                grad_reduce_dtype=grad_reduce,
                # a framework that steps its own optimizer says so (DeepSpeedCPUAdam)
                optimizer_impl=desc.get("optimizer_impl") or optimizer_impl(cfg.optim.impl, ctx.device.type),
                precision_recipe={**strategy.precision.recipe(), "grad_reduce": grad_reduce,
                                  **({"matmuls": FLOAT8_MATMULS} if cfg.run.float8 else {})})


def env_fields(ctx, threads: int, gathered: list) -> tuple[dict, list[str]]:
    """result.json's `env` (rank 0's machine, every rank's host and device) and the ranks' notes on
    their communication threads."""
    from ddlbench.rank import malloc
    env = envinfo.capture(ctx.device, ctx.backend, threads)
    env["hostnames"] = sorted({g["hostname"] for g in gathered})
    env["rank_hosts"] = [g["hostname"] for g in gathered]     # rank r ran on rank_hosts[r]
    if any(g.get("device_netns") for g in gathered):     # bench cluster with device namespaces
        env["rank_devices"] = [g.get("device_netns") for g in gathered]
    env["network"] = envinfo.network_ran_on()
    env["malloc"] = malloc.state()      # rank 0's; every CPU rank applies the same
    env["comm_threads"] = {"policy": gathered[0]["comm_threads"]["policy"],
                           "per_rank": [g["comm_threads"]["threads"] for g in gathered]}
    return env, sorted({g["comm_threads"]["note"] for g in gathered if g["comm_threads"].get("note")})


def timing_section(cfg, device_type: str, gathered: list, step_times: list, stats: dict, window_step: float,
                   steady, wall_s: float) -> tuple[dict, dict | None, list[str]]:
    """(`timing`, `stragglers` or None, warnings): the step-time distribution, the window the
    throughput is taken from, and what each rank's series says beyond it."""
    measure = len(gathered[0]["step_time_s"])
    timing = {
        "warmup_steps": len(gathered[0]["all_step_time_s"]) - measure, "measured_steps": measure,
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
            "flight on other streams is not waited for)" if device_type == "cuda" else ""),
    }
    if all(g.get("issue_time_s") for g in gathered):
        issue = max(summarize(g["issue_time_s"])["median"] for g in gathered)
        timing["issue_time_s_median"] = issue
        timing["launch_bound"] = launch_bound(issue, stats["median"], device_type,
                                              least_busy_pct([g.get("gpu") for g in gathered]))
    if all(g.get("host_events") for g in gathered):
        from ddlbench.rank.hostevents import slowest_step
        per_rank = [g["host_events"] for g in gathered]
        timing["host_events"] = {"per_rank": per_rank, "gc_policy": cfg.run.gc,   # ddlbench/rank/gcpolicy.py
                                 "slowest_step": slowest_step(step_times, stats["median"], per_rank)}
    for rule in ("window_rule", "warmup_rule"):   # run.min_window_s, run.warmup_max_steps: agreed over ranks,
        if gathered[0].get(rule):                 # so rank 0's is every rank's
            timing[rule] = gathered[0][rule]
    if cfg.run.step_split:
        timing["step_split"] = gather_split([g.get("step_split") for g in gathered])
    stragglers, warnings = None, []
    if all("host_time_s" in g for g in gathered):
        timing["per_rank_host_median_s"] = [summarize(g["host_time_s"])["median"] for g in gathered]
        stragglers = find_stragglers([g["host_time_s"] for g in gathered], stats["median"])
        warnings = describe_stragglers(stragglers)
    return timing, stragglers, warnings


def moe_section(spec, strategy, dims, precision: str, gathered: list, comm: dict | None) -> dict:
    """The router's statistics over ranks, the expert layout and, with experts over ranks, the
    all-to-all payload measured beside its uniform-routing count."""
    from ddlbench.models.moe import all_to_all_payload, load_summary
    layout = strategy.moe_record()
    moe = {**load_summary([g["moe"] for g in gathered if g.get("moe")], layout["ep"], dims.tp),
           "experts_implementation": spec.config.get("experts_implementation"),
           "routing": "dropless (transformers' top-k router: no capacity, no dropped tokens)", **layout}
    rows = moe.pop("dispatch_rows_per_microbatch", None) or spec.tokens_per_sample * dims.micro_batch * spec.top_k
    if layout["ep"] > 1 and comm:
        moe["all_to_all_payload_bytes_per_step"] = comm["per_step_bytes"].get("all_to_all")
        moe["all_to_all_payload_bytes_per_step_analytic"] = all_to_all_payload(
            len(moe["tokens_per_expert"]), dims.grad_accum * rows, 1, spec.config.get("hidden_size"),
            4 if precision == "fp32" else 2)
        moe["all_to_all_note"] = ("payload: each rank's all-to-all inputs per step (dispatch and combine in forward, "
                                  "their gradients in backward), the busiest rank; analytic: 4 x layers x rows x "
                                  "hidden x bytes, rows = tokens x top_k with uniform routing (a capacity-padded "
                                  "dispatch: experts x capacity), the token counts' exchange left out")
    return moe


def flops_section(flops: dict, recompute: str, ctx, key: str, peak, peak_source: str, mfu_value, hfu_value,
                  window_step: float, median_step: float, native, tokens_per_sample) -> dict:
    """`flops`: the count and its method, the peak MFU is taken on (and the measured one), HFU,
    MFU on the median step, both attention conventions, float8's share of the FLOPs."""
    measured, measured_source = measured_peak(ctx.device, key, peak, peak_source)
    out = {"train_per_sample": flops["flops"], "method": flops["method"],
           "palm_train_per_sample": flops["palm_flops"],
           "analytic": flops["analytic"],
           "hardware_train_per_sample": flops["hardware_flops"],
           "recompute": checkpointing.recompute_label(recompute),
           "hfu": hfu_value, "peak_dtype": key,
           "peak_per_device": peak, "peak_source": peak_source,
           "measured_peak_per_device": measured, "measured_peak_source": measured_source,
           "mfu_on_measured_peak": rebase_mfu(mfu_value, peak, measured),
           "mfu_median_step": (mfu_value * window_step / median_step
                               if mfu_value is not None and median_step > 0 else None),
           "note": "mfu = train_per_sample x samples/s / (devices x peak); hfu the same with "
                   "hardware_train_per_sample (recomputed forwards included)",
           **causal_mfu(flops, mfu_value)}
    f8 = native.get("float8") if isinstance(native, dict) else None
    if isinstance(f8, dict) and f8.get("converted_params") and mfu_value is not None and tokens_per_sample:
        share = float8_share(f8["converted_params"], tokens_per_sample, flops["flops"])
        out.update(float8_share=share, mfu_float8_weighted=float8_weighted_mfu(mfu_value, share),
                   float8_note=(f"mfu is on the {key} peak although {share:.1%} of the FLOPs ran as float8 "
                                f"matmuls; mfu_float8_weighted counts those at the fp8 peak "
                                f"({FP8_OVER_BF16:g}x bf16's): ddlbench/metrics/mfu.py"))
    return out


def checkpoint_section(per_rank: list[dict]) -> dict:
    """`checkpoint`: each save over ranks (ddlbench/metrics/checkpoint.summarize_saves), medians, the
    rate a save reached beside a plain write of the same size to the same directory."""
    from statistics import median

    from ddlbench.metrics.checkpoint import rate, summarize_saves
    saves = summarize_saves([r["saves"] for r in per_rank])
    first = per_rank[0]
    durable = [s["durable_s"] for s in saves if s["durable_s"] is not None]
    counted = [s for s in saves if all(b is not None for b in s["bytes_per_rank"]) and s["durable_s"]]
    plain = [r["plain_write"] for r in per_rank if (r.get("plain_write") or {}).get("bytes_per_s")]
    slow = [s["slowdown"] for s in saves if s["slowdown"] is not None]
    return {"mode": first["mode"], "every": first["every"], "dir": first["dir"], "method": first["method"],
            "saves": saves,
            "blocked_s_median": median(s["blocked_s"] for s in saves) if saves else None,
            "durable_s_median": median(durable) if durable else None,
            "bytes_per_save": counted[-1]["bytes"] if counted else None,
            "bytes_per_s": median(rate(s["bytes"], s["durable_s"]) for s in counted) if counted else None,
            "plain_write_bytes_per_s": min(p["bytes_per_s"] for p in plain) if plain else None,
            "slowdown_median": median(slow) if slow else None,
            "wait_at_end_s": max(r["wait_s"] for r in per_rank),
            # run.checkpoint.resume_from: the load by phase, slowest rank each (None: the run began afresh)
            "restore": restore_phases([r.get("restored") for r in per_rank]),
            "note": "per save: blocked_s = the loop stopped between two steps (max over ranks; not in any step time); "
                    "durable_s = from the call until the last rank's write was on disk; slowdown = the steps that "
                    "ended while an async save was written, their mean over the window's median step, less 1 "
                    "(largest over ranks); bytes_per_s = bytes / durable_s, beside plain_write_bytes_per_s: each "
                    "rank's largest share written to one file in the same directory and fsynced (the slowest rank)"}


def restore_phases(per_rank: list) -> dict | None:
    """A resumed run's load over ranks: the path and step, each phase's seconds on its slowest rank."""
    if not per_rank or per_rank[0] is None:
        return None
    first = per_rank[0]
    phases = {k: max(r[k] for r in per_rank if r.get(k) is not None) for k in first
              if k not in ("path", "step") and any(r.get(k) is not None for r in per_rank)}
    return {"path": first["path"], "step": first["step"], **phases,
            "note": "seconds, the slowest rank's: target_s = this rank's state to load into, read_s = read and "
                    "resharded into this layout (DCP; DeepSpeed's load_checkpoint; torch.load), apply_s = set into "
                    "the model and optimizer, first_step_s = the first training step after it (process start and "
                    "group: startup_s)"}
