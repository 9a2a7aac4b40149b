"""One GPU plan step's records as a Markdown table, each run beside what the memory estimator says for
it (the same `ddlbench.estimate.memcheck.predicted` that `run.micro_batch=auto` and advise use,
profiled here on the meta device for a CUDA rank).

    .venv/bin/python benchmarks/gpu_table.py reports/gpu-h200/2026-11-27/L [more step dirs]

Columns: tokens/s, MFU on the datasheet peak (full T x T attention; the causal convention beside it),
the rank's peak allocated memory, the estimate and its signed error, the estimator's activation
bytes, seconds from the command to the first step, the MoE load imbalance where the model has
experts, and how much the window's slowest step alone moved its figure (records from run.min_window_s on). Nothing here is timed: it reads records.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

GIB = 2 ** 30


def setting(record: dict) -> str:
    """What distinguishes a cell: the options a plan cell overrides, in short (the experts'
    kernel as it ran, not as configured: `auto` resolves per device)."""
    cfg = record["config"]
    o = cfg["framework"]["options"]
    m = cfg["model"]
    bits = ([f"T={m['seq_len']}"] if m.get("seq_len") else []) + [f"mb {cfg['run']['micro_batch']}/{cfg['run']['global_batch']}"]
    if m.get("attention") not in (None, "auto"):
        bits.append(f"attention {m['attention']}")
    if cfg["run"].get("device_memory_gb"):
        bits.append(f"cap {cfg['run']['device_memory_gb']} GB")
    if "batch_norm_units" in o and not m.get("seq_len"):
        bits.append(f"batch norm {o['batch_norm_units']}")
    if o.get("activation_checkpointing") not in (None, False, "none"):
        bits.append(f"ac={o['activation_checkpointing']}")
    if m.get("moe"):
        ran = (record.get("moe") or {}).get("experts_implementation", m["moe"].get("experts_implementation"))
        bits.append(f"experts={'loop' if ran.startswith('DeepSpeed') else ran}")
    for k in ("ep", "ep_size"):
        if k in o:
            bits.append(f"{k}={o[k]}")
    if m.get("n_layer"):
        bits.append(f"{m['n_layer']} layers")
    if cfg["run"].get("gc", "freeze") != "freeze":
        bits.append(f"gc={cfg['run']['gc']}")
    if cfg["run"].get("min_window_s"):
        bits.append(f"window >= {cfg['run']['min_window_s']:g} s")
    return ", ".join(bits)


def row(record: dict) -> dict:
    from ddlbench.estimate.memcheck import error, predicted
    from ddlbench.planning.config import validate
    ok = record["status"] == "ok"
    peak = record["memory"]["per_rank"][0]["peak_allocated_bytes"] if ok else None
    try:
        cfg = copy.deepcopy(record["config"])
        if cfg["run"]["micro_batch"] == "auto":   # what it chose, not what the estimate would choose now
            cfg["run"]["micro_batch"] = record["parallel"]["micro_batch"]
        est = predicted(validate(cfg), device="cuda")
    except ValueError as e:                    # a variant without a cost model (deepspeed_moe)
        print(f"{record['run_id']}: no estimate: {e}", file=sys.stderr)
        est = None
    moe = record.get("moe") or {}
    fl = record.get("flops") or {}
    return {"run": record["run_id"], "framework": record["config"]["framework"]["name"] + ":" +
            record["config"]["framework"]["variant"], "setting": setting(record),
            "status": record["status"], "tokens_per_s": (record["throughput"] or {}).get("tokens_per_s"),
            "samples_per_s": (record["throughput"] or {}).get("samples_per_s"),
            "mfu": record["mfu"], "mfu_causal": fl.get("mfu_causal"), "peak_gib": peak and peak / GIB,
            "estimate_gib": est and est["total"] / GIB, "error": est and peak and error(est["total"], peak),
            "activations_gib": est and est.get("activations", 0) / GIB,
            "startup_s": (record.get("startup_s") or {}).get("total_to_first_step"),
            "imbalance": moe.get("imbalance_experts_max"),
            "slowest_step_moves": ((record.get("timing") or {}).get("window_vs_median") or {}).get("slowest_step_moves")}


def markdown(rows: list[dict]) -> str:
    out = ["| framework | setting | tokens/s (samples/s) | MFU (causal) | peak alloc GiB | estimate GiB (error) | "
           "est. activations GiB | start-up s | expert imbalance | slowest step's share |", "|" + "---|" * 10]
    for r in rows:
        if r["status"] != "ok":   # what the estimator said of a cell that did not end ok
            est = f"{r['estimate_gib']:.1f}" if r["estimate_gib"] is not None else "no cost model"
            out.append(f"| {r['framework']} | {r['setting']} | **{r['status']}** | - | - | {est} | - | - | - | - |")
            continue
        causal = f" ({100 * r['mfu_causal']:.1f}%)" if r["mfu_causal"] is not None else ""
        imb = f"{r['imbalance']:.2f}" if r["imbalance"] is not None else "-"
        est = (f"{r['estimate_gib']:.1f} ({100 * r['error']:+.0f}%) | {r['activations_gib']:.1f}"
               if r["estimate_gib"] is not None else "no cost model | -")
        rate = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else f"({r['samples_per_s']:,.0f})"
        moves = f"{100 * r['slowest_step_moves']:.1f}%" if r.get("slowest_step_moves") is not None else "-"
        out.append(f"| {r['framework']} | {r['setting']} | {rate} | {100 * r['mfu']:.1f}%{causal} | "
                   f"{r['peak_gib']:.1f} | {est} | {r['startup_s']:.1f} | {imb} | {moves} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="+", type=Path, help="a gpu_matrix output dir (with runs/)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    rows = []
    for step in a.steps:
        for f in sorted(step.glob("runs/*/result.json"), key=lambda p: p.stat().st_mtime):
            record = json.loads(f.read_text())
            if record.get("status") != "ok":
                print(f"{record.get('run_id')}: {record.get('status')}: "
                      f"{((record.get('error') or {}).get('message') or '')[:200]}", file=sys.stderr)
            rows.append(row(record))
    print(markdown(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
