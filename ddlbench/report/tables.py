"""The report's derived tables: repeats aggregated per configuration, parity, failures."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ddlbench.metrics.stats import bootstrap_median_ci, repeat_range
from ddlbench.report.fmt import missing

# What must be equal between compared runs (docs/design.md §7). Compared = same model, same world size.
PARITY_FIELDS = ["data", "seed", "global_batch", "optimizer", "lr", "weight_decay", "precision", "grad_reduce_dtype",
                 "precision_recipe", "compile", "float8", "optimizer_impl", "attention", "activation_checkpointing",
                 "gc", "epochs"]
# Fields records before they existed do not carry (and vision models have no attention kernel):
# unknown there, compared where known.
PARITY_OPTIONAL = {"grad_reduce_dtype", "precision_recipe", "optimizer_impl", "attention", "activation_checkpointing"}
# What each framework does by design, its recommended recipe (DeepSpeed reduces gradients in the
# training dtype, FSDP2 casts parameters while gathered): between frameworks shown, not flagged;
# between configurations of one framework a user's override, flagged (it can be equalised).
BY_DESIGN = {"grad_reduce_dtype", "precision_recipe"}
# optim.impl's choices: a difference between them is the user's; a framework's own optimizer
# (DeepSpeed's CPU Adam under offload) is its design
TORCH_OPTIMIZER_IMPLS = {"fused", "foreach", "for_loop"}


def cells(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (repeats together): run counts, and the median of throughput
    and time-to-target over its ok repeats with a 95% bootstrap interval (from MIN_CI_REPEATS
    repeats) or, with fewer, their range."""
    out = []
    for cid, g in df.groupby("config_id", sort=False):
        ok = g[g["status"] == "ok"]
        sps = bootstrap_median_ci(ok["samples_per_s"].tolist())
        ttt = bootstrap_median_ci(ok["time_to_target_s"].dropna().tolist())
        sps_range = repeat_range(ok["samples_per_s"].tolist())
        ttt_range = repeat_range(ok["time_to_target_s"].dropna().tolist())
        first = g.iloc[0]
        out.append({
            "config_id": cid, "label": first["label"], "model": first["model"],
            "settings": first["settings"] if "settings" in g else "",
            "world_size": first["world_size"], "global_batch": first["global_batch"],
            "precision": first["precision"] if "precision" in g else None,
            "recipe": recipe_of(first),
            "runs": len(g), "ok": len(ok), "oom": int((g["status"] == "oom").sum()),
            "seq_len": first["seq_len"] if "seq_len" in g else None,
            "tokens_per_s": _median(ok["tokens_per_s"]) if "tokens_per_s" in ok else None,
            "samples_per_s": sps[0], "samples_per_s_ci_low": sps[1], "samples_per_s_ci_high": sps[2],
            "time_to_target_s": ttt[0], "time_to_target_ci_low": ttt[1], "time_to_target_ci_high": ttt[2],
            "samples_per_s_range": sps_range, "time_to_target_range": ttt_range,
            # each ok run's figure and when its window began: the verdict's test (ddlbench/metrics/compare.py)
            "samples_per_s_runs": [float(x) for x in ok["samples_per_s"] if not missing(x)],
            "began_runs": [None if missing(t) else float(t) for t, x in
                           zip(ok.get("window_began_unix", [None] * len(ok)), ok["samples_per_s"]) if not missing(x)],
            "scaling_efficiency": _median(ok["scaling_efficiency"]), "scaling_kind": _first(ok["scaling_kind"]),
            "peak_memory_bytes": _median(ok["peak_memory_bytes"]),
            "tracker_peak_bytes": _median(ok["tracker_peak_bytes"]) if "tracker_peak_bytes" in ok else None,
            "rss_above_baseline_bytes": _median(ok["rss_above_baseline_bytes"]),
            "model_state_bytes_theory": _first(ok["model_state_bytes_theory"]),
            "comm_bytes_per_step": _median(ok["comm_bytes_per_step"]),
            "comm_wire_bytes_per_rank": _median(ok["comm_wire_bytes_per_rank"]),
            "comm_analytic_wire_bytes_per_rank": _first(ok["comm_analytic_wire_bytes_per_rank"]),
            "mfu": _median(ok["mfu"]), "final_val_loss": _median(ok["final_val_loss"]),
            **{c: _first(g[c]) if c in g else None for c in TAXONOMY_COLUMNS},
            "final_val_accuracy": _median(ok["final_val_accuracy"]),
        })
    return pd.DataFrame(out)


RECIPE_SETTINGS = ("compile", "float8")   # settings every framework takes alike and a verdict must not mix


def recipe_of(row) -> str:
    """The run-wide settings that change every framework's speed alike (run.compile, run.float8),
    as overrides; '' for the default (eager, bf16/fp32 matmuls)."""
    return " ".join(f"run.{k}=true" for k in RECIPE_SETTINGS if _true(row.get(k)))


def _true(value) -> bool:
    """True for True and numpy's True (a frame's cell); False for False, None and NaN."""
    return value is not None and value == value and bool(value)


TAXONOMY_COLUMNS = ["tax_parallelism", "tax_synchronisation", "tax_communication", "tax_sharding", "tax_compression"]


REFERENCE = "ddp"     # the configuration (conf/framework) others are compared with: docs/design.md §7


def strategies(cells_df: pd.DataFrame) -> pd.DataFrame:
    """Per model and world size: each configuration's taxonomy, the bytes each rank sends per
    step and its time to target, both relative to DDP's (the default variant) where it ran."""
    rows = []
    for (model, world), g in cells_df.groupby(["model", "world_size"], sort=True):
        ref = g[g["label"] == REFERENCE]
        ref_wire = _first(ref["comm_wire_bytes_per_rank"]) if len(ref) else None
        ref_ttt = _first(ref["time_to_target_s"]) if len(ref) else None
        for _, r in g.iterrows():
            wire, ttt = r["comm_wire_bytes_per_rank"], r["time_to_target_s"]
            rows.append({"model": model, "world_size": world, "label": r["label"],
                         **{c: r.get(c) for c in TAXONOMY_COLUMNS},
                         "wire_bytes_per_rank": wire,
                         "wire_vs_ddp": wire / ref_wire if _num_ok(wire) and _num_ok(ref_wire) and ref_wire else None,
                         "time_to_target_s": ttt,
                         "time_to_target_vs_ddp": ttt / ref_ttt if _num_ok(ttt) and _num_ok(ref_ttt) and ref_ttt else None})
    return pd.DataFrame(rows)


def _num_ok(x) -> bool:
    return not missing(x)


def _median(s: pd.Series):
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else None


def _first(s: pd.Series):
    s = s.dropna()
    return s.iloc[0] if len(s) else None


def parity(df: pd.DataFrame) -> pd.DataFrame:
    """Configurations of one model at one world size are compared (repeats share every parity
    field, so one row per configuration). A field the user sets (data, seed, batch, optimizer, LR,
    precision, compile, float8, optim.impl, attention) is checked against the value most of them
    share; a field that is the framework's design (BY_DESIGN) against the configurations of the
    same framework only (its difference across frameworks is in `by_design`, shown, not flagged);
    every configuration that differs is flagged with the fields (`differs`)."""
    rows = []
    for (model, world), g in df.groupby(["model", "world_size"], sort=True):
        configs = g.drop_duplicates("config_id")
        ref = {f: _mode(_comparable(configs, f)) for f in PARITY_FIELDS if f not in BY_DESIGN}
        for _, r in configs.iterrows():
            same_fw = configs[configs["framework"] == r["framework"]]
            diff, design = [], []
            for f in PARITY_FIELDS:
                if f in PARITY_OPTIONAL and _norm(r[f]) is None:
                    continue
                if f in BY_DESIGN:
                    if not _same(r[f], _mode(same_fw[f].dropna())):
                        diff.append(f)
                    elif not _same(r[f], _mode(configs[f].dropna())):
                        design.append(f)
                elif f == "optimizer_impl" and _norm(r[f]) not in TORCH_OPTIMIZER_IMPLS:
                    continue
                elif not _same(r[f], ref[f]):
                    diff.append(f)
            rows.append({"model": model, "world_size": world, "label": r["label"], "run_id": r["run_id"],
                         "runs": int((g["config_id"] == r["config_id"]).sum()),
                         **{f: r[f] for f in PARITY_FIELDS}, "differs": diff, "by_design": design})
    return pd.DataFrame(rows, columns=["model", "world_size", "label", "run_id", "runs", *PARITY_FIELDS, "differs",
                                       "by_design"])


def _comparable(configs: pd.DataFrame, field: str) -> pd.Series:
    """The values a field's majority is taken over: known ones for optional fields; for the
    optimizer's implementation only optim.impl's own choices."""
    values = configs[field].dropna() if field in PARITY_OPTIONAL else configs[field]
    if field == "optimizer_impl":
        values = values[values.map(lambda v: _norm(v) in TORCH_OPTIMIZER_IMPLS)]
    return values


def _norm(v):
    """Comparable form of a cell: None for missing, float for numbers, str otherwise."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return float(v)
    return str(v)


_NO_MAJORITY = object()


def _mode(s: pd.Series):
    """The value most runs share; none if the top count is tied (then every run is flagged)."""
    vals = [_norm(v) for v in s.tolist()]
    counts = sorted(((vals.count(v), repr(v), v) for v in set(vals)), reverse=True, key=lambda t: (t[0], t[1]))
    if not counts or (len(counts) > 1 and counts[0][0] == counts[1][0]):
        return _NO_MAJORITY
    return counts[0][2]


def _same(value, ref) -> bool:
    return ref is not _NO_MAJORITY and _norm(value) == ref


def failures(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["run_id", "label", "model", "world_size", "status", "error_type", "error_rank", "error_message", "path"]
    return df[df["status"] != "ok"][cols].reset_index(drop=True)
