"""Result records -> the summary table (one row per run, docs/design.md §6 columns first), plus the
groupings the report needs: repeats of one configuration, and scaling series."""
from __future__ import annotations

import hashlib
import json

import pandas as pd

SUMMARY_COLUMNS = [  # docs/design.md §6 contract, in this order; more columns follow
    "run_id", "status", "framework", "variant", "model", "world_size", "global_batch",
    "samples_per_s", "tokens_per_s", "step_time_median_s", "peak_memory_bytes", "mfu",
    "scaling_efficiency", "scaling_kind", "time_to_target_s",
]
# Keys that do not change what is measured: left out of the configuration identity.
VOLATILE = {("run", "dir"), ("run", "progress"), ("run", "repeat"), ("run", "timeout_s"),
            ("run", "pg_timeout_s"), ("launcher", "monitor_interval_s"), ("logger",)}
SCALING_FREE = {("launcher", "nproc"), ("run", "global_batch"), ("run", "micro_batch"),
                ("launcher", "threads_per_rank")}


def _window_began(record: dict) -> float | None:
    spans = (record.get("timing") or {}).get("per_rank_window_unix_s") or []
    starts = [span[0] for span in spans if isinstance(span, (list, tuple)) and span and span[0] is not None]
    return min(starts) if starts else None


def ac_policy(cfg: dict) -> str | None:
    """The run's activation checkpointing policy (ddlbench/models/checkpointing.py); None where its
    framework has no such option (a pipeline, Horovod)."""
    from ddlbench.models.checkpointing import normalize
    options = (cfg.get("framework") or {}).get("options") or {}
    if "activation_checkpointing" not in options:
        return None
    try:
        return normalize(options["activation_checkpointing"])
    except ValueError:
        return None

def _strip(config: dict, drop: set) -> dict:
    out = {}
    for group, value in config.items():
        if (group,) in drop:
            continue
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if (group, k) not in drop}
        out[group] = value
    return out


def _canonical(obj) -> bytes:
    try:
        import orjson
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (ImportError, TypeError):
        return json.dumps(obj, sort_keys=True, default=str).encode()


def config_id(config: dict, drop: set = frozenset()) -> str:
    """Hash of the resolved config without volatile keys: repeats of one cell share it."""
    return hashlib.sha1(_canonical(_strip(config or {}, VOLATILE | set(drop)))).hexdigest()[:10]


def as_run(config: dict, record: dict) -> dict:
    """The config as it ran: run.precision=auto replaced by the precision the record says ran,
    so runs of one `auto` config on a GPU (bf16) and a CPU (fp32) are not repeats of each other."""
    run = config.get("run") or {}
    if run.get("precision") == "auto" and record.get("precision"):
        return {**config, "run": {**run, "precision": record["precision"]}}
    return config


def flat(config: dict) -> dict:
    """{'group.key': value} of a config without its volatile keys (deeper values kept whole)."""
    out = {}
    for group, value in _strip(config or {}, VOLATILE).items():
        if isinstance(value, dict):
            out.update({f"{group}.{k}": v for k, v in value.items()})
        else:
            out[group] = value
    return out


def _show(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "null"
    return v if isinstance(v, str) else _canonical(v).decode()


def distinguishing_settings(configs: list[dict], groups: list) -> list[str]:
    """Per run: the settings that tell its configuration apart from the others in its group (one
    framework variant, model, world size and precision), as the overrides `key=value ...` that
    differ within the group; '' where the group holds one configuration. Without it the report's
    comparison showed such configurations (compiled or not, another micro-batch) as identical rows."""
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [""] * len(configs)
    for idx in members.values():
        flats = [flat(configs[i]) for i in idx]
        keys = sorted(set().union(*flats))
        varying = [k for k in keys if len({_canonical(f.get(k)) for f in flats}) > 1]
        for i, f in zip(idx, flats):
            out[i] = " ".join(f"{k}={_show(f.get(k))}" for k in varying)
    return out


def _peak_memory(record: dict):
    peaks = []
    for m in (record.get("memory") or {}).get("per_rank") or []:
        p = m.get("peak_allocated_bytes") or m.get("peak_rss_bytes")
        if p is not None:
            peaks.append(p)
    return max(peaks) if peaks else None


def _tracker_peak(record: dict):
    """The busiest rank's tensor peak counted by torch's MemTracker (run.memory_tracker, or
    run.device_memory_gb on a CPU); None where it did not run."""
    peaks = [(m.get("tracker") or {}).get("peak_bytes") for m in (record.get("memory") or {}).get("per_rank") or []]
    peaks = [p for p in peaks if p]
    return max(peaks) if peaks else None


def _rss_above_baseline(record: dict):
    """CPU runs: max over ranks of peak RSS minus the post-import baseline (what the run added)."""
    deltas = [m["peak_rss_bytes"] - m["baseline_rss_bytes"]
              for m in (record.get("memory") or {}).get("per_rank") or []
              if m.get("peak_allocated_bytes") is None and m.get("peak_rss_bytes") and m.get("baseline_rss_bytes")]
    return max(deltas) if deltas else None


def training_memory_bytes(record: dict):
    """What training added on the busiest rank: CUDA's peak allocated (reset after setup), or on
    CPU peak RSS above the post-import baseline."""
    allocated = [m["peak_allocated_bytes"] for m in (record.get("memory") or {}).get("per_rank") or []
                 if m.get("peak_allocated_bytes") is not None]
    return max(allocated) if allocated else _rss_above_baseline(record)


def recipe_text(recipe: dict | None) -> str | None:
    """framework.precision_recipe in one cell: params/compute dtypes, master weights, scaling (the
    reduction dtype is a parity field of its own, grad_reduce_dtype)."""
    if not recipe:
        return None
    return (f"params {recipe.get('params')}, compute {recipe.get('compute')}"
            + (f", master {recipe['master_weights']}" if recipe.get("master_weights") else "")
            + (f", {recipe['loss_scaling']}" if recipe.get("loss_scaling") else "")
            + (", float8 matmuls" if recipe.get("matmuls") else ""))


def checkpoint_columns(ck: dict) -> dict:
    """The run's saves in summary.csv: mode, blocked and durable seconds, the steps' slowdown while an
    async save was written, bytes per save, the rate reached beside a plain write's."""
    return {"checkpoint_mode": ck.get("mode"), "checkpoint_blocked_s": ck.get("blocked_s_median"),
            "checkpoint_durable_s": ck.get("durable_s_median"), "checkpoint_slowdown": ck.get("slowdown_median"),
            "checkpoint_bytes": ck.get("bytes_per_save"), "checkpoint_bytes_per_s": ck.get("bytes_per_s"),
            "checkpoint_plain_write_bytes_per_s": ck.get("plain_write_bytes_per_s")}


def summary_row(record: dict, path: str = "") -> dict:
    cfg = record.get("config") or {}
    par = record.get("parallel") or {}
    tp = record.get("throughput") or {}
    st = (record.get("timing") or {}).get("step_time_s") or {}
    steady = (record.get("timing") or {}).get("window_vs_median") or {}
    conv = record.get("convergence") or {}
    evals = conv.get("eval") or []
    comm = record.get("comm") or {}
    err = record.get("error") or {}
    optim = cfg.get("optim") or {}
    run = cfg.get("run") or {}
    return {
        "run_id": record.get("run_id"), "status": record.get("status"),
        "framework": (record.get("framework") or {}).get("name"),
        "variant": (record.get("framework") or {}).get("variant"),
        "model": (record.get("model") or {}).get("name"),
        "world_size": par.get("world_size") or (cfg.get("launcher") or {}).get("nproc"),
        "global_batch": par.get("global_batch") or run.get("global_batch"),
        "samples_per_s": tp.get("samples_per_s"), "tokens_per_s": tp.get("tokens_per_s"),
        "step_time_median_s": st.get("median"),
        "peak_memory_bytes": _peak_memory(record), "mfu": record.get("mfu"),
        "tracker_peak_bytes": _tracker_peak(record),
        "scaling_efficiency": None, "scaling_kind": None,
        "time_to_target_s": conv.get("time_to_target_s"),
        # ---- beyond the contract ----
        "epochs_to_target": conv.get("epochs_to_target"),
        "target": conv.get("target"), "target_metric": conv.get("target_metric"),
        "final_val_loss": evals[-1].get("loss") if evals else None,
        "final_val_accuracy": evals[-1].get("accuracy") if evals else None,
        "final_objective": (conv.get("final_objective") or {}).get("value"),
        "hfu": (record.get("flops") or {}).get("hfu"),
        "loss_floor": (conv.get("floor") or {}).get("loss"),
        "data": (cfg.get("data") or {}).get("name"),
        "precision": record.get("precision"),
        "grad_reduce_dtype": (record.get("framework") or {}).get("grad_reduce_dtype"),
        # how the precision is applied (autocast, FSDP2's MixedPrecisionPolicy, DeepSpeed's engine)
        "precision_recipe": recipe_text((record.get("framework") or {}).get("precision_recipe")),
        "compile": bool(run.get("compile", False)),
        "float8": bool(run.get("float8", False)),
        "optimizer_impl": (record.get("framework") or {}).get("optimizer_impl"),
        "attention": ((record.get("model") or {}).get("native_config") or {}).get("attn_implementation"),
        "activation_checkpointing": ac_policy(cfg),
        # the collector's policy in the loop (ddlbench/rank/gcpolicy.py); records before run.gc ran Python's thresholds
        "gc": run.get("gc", "python"),
        "seq_len": (cfg.get("model") or {}).get("seq_len"),
        "seed": record.get("seed"),
        "repeat": run.get("repeat", 0), "optimizer": optim.get("name"), "lr": optim.get("lr"),
        "weight_decay": optim.get("weight_decay"), "epochs": run.get("epochs"),
        "micro_batch": par.get("micro_batch"), "dp": par.get("dp"), "tp": par.get("tp"), "pp": par.get("pp"),
        "samples_per_s_per_device": tp.get("samples_per_s_per_device"),
        "step_time_p10_s": st.get("p10"), "step_time_p90_s": st.get("p90"),
        # the median step's throughput beside the window's, and whether outlying steps set them apart
        "samples_per_s_median_step": tp.get("samples_per_s_median_step"),
        "window_outlier": steady.get("outlier"),
        # the measured window's seconds and how much its slowest step alone moves the window's figure
        "window_s": steady.get("window_s"),
        # when the measured window began (its first rank's start, unix s): whether repeats interleaved
        "window_began_unix": _window_began(record),
        "slowest_step_moves": steady.get("slowest_step_moves"),
        "model_state_bytes_theory": (record.get("memory") or {}).get("model_state_bytes_per_rank_theory"),
        "rss_above_baseline_bytes": _rss_above_baseline(record),
        "comm_bytes_per_step": sum((comm.get("per_step_bytes") or {}).values()) if comm else None,
        "comm_wire_bytes_per_rank": comm.get("wire_bytes_per_rank") if comm else None,
        "comm_analytic_wire_bytes_per_rank": comm.get("analytic_wire_bytes_per_rank") if comm else None,
        # Mixture of Experts (empty for dense models)
        "active_params": (record.get("model") or {}).get("active_params"),
        "moe_ep": (record.get("moe") or {}).get("ep"),
        "moe_imbalance_experts_max": (record.get("moe") or {}).get("imbalance_experts_max"),
        "moe_imbalance_ep_ranks_max": (record.get("moe") or {}).get("imbalance_ep_ranks_max"),
        "moe_all_to_all_bytes_per_step": (record.get("moe") or {}).get("all_to_all_payload_bytes_per_step"),
        # run.checkpoint (empty without saves): medians over the run's saves (result.json: checkpoint)
        **checkpoint_columns(record.get("checkpoint") or {}),
        # a run torch's elastic agent restarted (launcher.max_restarts; result.json: recovery)
        "recovery_attempts": (record.get("recovery") or {}).get("attempts"),
        "recovery_steps_lost": (record.get("recovery") or {}).get("steps_lost"),
        "recovery_lost_s": (record.get("recovery") or {}).get("lost_s"),
        **{f"tax_{k}": v for k, v in ((record.get("framework") or {}).get("taxonomy") or {}).items()},
        "stragglers": ",".join(map(str, (record.get("stragglers") or {}).get("flagged") or [])) or None,
        "error_type": err.get("type"), "error_rank": err.get("rank"),
        "error_message": (err.get("message") or "").strip().splitlines()[0][:300] if err.get("message") else None,
        "config_id": config_id(as_run(cfg, record)), "scaling_group": config_id(as_run(cfg, record), SCALING_FREE),
        "path": path,
    }


def summary_frame(records: list[dict], paths: list[str]) -> pd.DataFrame:
    df = pd.DataFrame([summary_row(r, p) for r, p in zip(records, paths)])
    if df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df["label"] = df["framework"].astype(str) + df["variant"].map(
        lambda v: "" if v in (None, "default") or v != v else f":{v}")   # v != v: NaN, a record without one
    df["settings"] = distinguishing_settings([as_run(r.get("config") or {}, r) for r in records],
                                             list(zip(df["label"], df["model"], df["world_size"], df["precision"])))
    add_scaling(df)
    return df.sort_values(["model", "label", "world_size", "repeat", "run_id"], kind="stable").reset_index(drop=True)


def add_scaling(df: pd.DataFrame) -> None:
    """Efficiency of each ok run against the median throughput at the smallest world size of its
    series: runs with the same config except world size, holding either the global batch
    (strong) or the per-device batch (weak). A run in both kinds of series is labelled strong."""
    df["scaling_efficiency"] = df["scaling_efficiency"].astype(object)
    ok = df[(df["status"] == "ok") & df["samples_per_s"].notna()].copy()
    if ok.empty:      # every run failed (or none measured): no series, and the report still lists the failures
        return
    ok["per_device_batch"] = ok["global_batch"] / ok["world_size"]
    for kind, held in (("weak", "per_device_batch"), ("strong", "global_batch")):  # strong wins
        keys = ok[["scaling_group", held]].astype(str).agg("|".join, axis=1)
        n0 = ok.groupby(keys)["world_size"].transform("min")
        sizes = ok.groupby(keys)["world_size"].transform("nunique")
        base = ok[ok["world_size"] == n0].groupby(keys[ok["world_size"] == n0])["samples_per_s"].median()
        x0 = keys.map(base)
        series = sizes >= 2
        eff = (ok["samples_per_s"] / ok["world_size"]) / (x0 / n0)  # metrics.throughput.scaling_efficiency, vectorised
        df.loc[eff[series].index, "scaling_efficiency"] = eff[series].astype(float).tolist()
        df.loc[eff[series].index, "scaling_kind"] = kind
