"""`bench project`'s roofline held against GPU runs of one model at several sequence lengths: for each
(framework, activation checkpointing) the shortest run calibrates the efficiency, and the longer runs'
tokens/s are predicted from their own configurations (each record's config re-planned at its world
size, `ddlbench.project.spec.Spec(config=...)`), twice: with the attention FLOPs the run's kernel
computes (a fused causal kernel: half of the T x T scores; the predictor's count) and with the full
T x T (the flop counter's and MFU's convention).

    .venv/bin/python benchmarks/length_check.py [RUNS_DIR ...] [--json OUT.json]

Default RUNS_DIR: the one-H200 long-context runs of 2026-11-27 (reports/gpu-h200/2026-11-27/{L,X}/runs).
Measured tokens/s: the median step's (`throughput.samples_per_s_median_step` x seq_len), so that a
garbage-collector stall in a 20-step window does not move the calibration; the window's is printed
beside it. A run its record calls launch-bound (`timing.launch_bound`) is left out: its rate is the
host's issuing, which no FLOP count prices. Nothing is asserted: docs/projection.md keeps the table with this command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [REPO / "reports/gpu-h200/2026-11-27/L/runs", REPO / "reports/gpu-h200/2026-11-27/X/runs"]


def records(dirs: list[Path]) -> list[dict]:
    out = []
    for d in dirs:
        for f in sorted(d.glob("*/result.json")):
            rec = json.loads(f.read_text())
            if rec.get("status") != "ok" or rec["model"]["kind"] != "language":
                continue
            if (rec.get("timing", {}).get("launch_bound") or {}).get("value"):
                print(f"skipped (launch-bound: its rate is the host's issuing, not its FLOPs'): {f.parent.name}")
                continue
            cfg = rec["config"]
            seq = int(cfg["model"]["seq_len"])
            out.append({"dir": str(f.parent.relative_to(REPO)) if f.is_relative_to(REPO) else str(f.parent),
                        "config": cfg, "seq_len": seq, "world": int(rec["parallel"]["world_size"]),
                        "group": (rec["model"]["name"], f.parent.name.split("-")[0],
                                  cfg["framework"].get("options", {}).get("activation_checkpointing", "none")),
                        "tokens_median": rec["throughput"]["samples_per_s_median_step"] * seq / int(rec["parallel"]["world_size"]),
                        "tokens_window": rec["throughput"]["tokens_per_s"] / int(rec["parallel"]["world_size"])})
    return out


def spec_of(rec: dict, peak: float):
    from ddlbench.project.spec import Spec
    d = rec["config"]["run"]
    return Spec((), int(d["global_batch"]) // rec["world"], peak, config=rec["config"], device="cuda")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model as network
    from ddlbench.project import spec as spec_mod
    from ddlbench.project.spec_command import gpu_peak

    pricing = Pricing(network.for_world_sizes("dgx_h100", [8]), "best")
    peak = gpu_peak("H200", "bf16")
    counted = spec_mod._profile

    def profile_full(plan, device):       # the full T x T: what the predictor priced before
        return dataclasses.replace(counted(plan, device), causal_skip=0.0)

    groups: dict[tuple, list[dict]] = {}
    for r in records(a.dirs):
        groups.setdefault(r["group"], []).append(r)
    rows = []
    for group, recs in sorted(groups.items()):
        recs.sort(key=lambda r: r["seq_len"])
        if len(recs) < 2:
            continue
        base = recs[0]
        effs = {}
        for count, prof_fn in (("causal", counted), ("full", profile_full)):
            spec_mod._profile = prof_fn
            effs[count] = spec_mod.solve_efficiency(spec_of(base, peak), pricing, base["tokens_median"], base["world"])
        for r in recs[1:]:
            row = {"model": group[0], "framework": group[1], "ac": group[2], "calibrated_on": base["seq_len"],
                   "seq_len": r["seq_len"], "measured_tokens_per_s": r["tokens_median"],
                   "measured_window_tokens_per_s": r["tokens_window"], "record": r["dir"]}
            for count, prof_fn in (("causal", counted), ("full", profile_full)):
                spec_mod._profile = prof_fn
                got = spec_mod.rows(spec_of(r, peak), pricing, [r["world"]], effs[count])[0]["tokens_per_s_per_device"]
                row[f"predicted_{count}"] = got
                row[f"error_{count}"] = got / r["tokens_median"] - 1
                row[f"efficiency_{count}"] = effs[count]
            spec_mod._profile = counted
            rows.append(row)
            print(f"{group[0]} {group[1]} ac={group[2]:13s} {base['seq_len']:>6} -> {r['seq_len']:>6}: measured "
                  f"{r['tokens_median']:8,.0f} tokens/s (window {r['tokens_window']:,.0f}); predicted causal "
                  f"{row['predicted_causal']:8,.0f} ({row['error_causal']:+.1%}), full T x T "
                  f"{row['predicted_full']:8,.0f} ({row['error_full']:+.1%})", flush=True)
    if rows:
        for count in ("causal", "full"):
            errs = [abs(r[f"error_{count}"]) for r in rows]
            print(f"{count}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%}, "
                  f"{sum(e <= 0.10 for e in errs)} of {len(errs)} within 10%")
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "peak_flops": peak, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
