"""What `bench advise` prints: the candidate table, the ranking, the result and the recommendation."""
from __future__ import annotations

import math
from pathlib import Path

from ddlbench.advise.options import ADVICE
from ddlbench.advise.state import Advice


def _fmt(x, scale=1.0, f=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x * scale, f)


def table(state: Advice, limit: int = 15) -> str:
    rows = [("rank", "candidate", "pred ms", "meas ms", "est MiB", "meas MiB", "status / why pruned")]
    ranked = sorted((c for c in state.candidates if c.get("rank")), key=lambda c: c["rank"])
    for c in ranked[:limit]:
        m = c.get("measured") or {}
        rows.append((str(c["rank"]), c["label"], _fmt(c["predicted"]["step_s"], 1e3),
                     _fmt(m.get("step_s"), 1e3), _fmt(c["memory_estimate"]["with_overhead"], 1 / 2**20, ".0f"),
                     _fmt(m.get("memory_bytes"), 1 / 2**20, ".0f"), m.get("status", "predicted")))
    for c in state.candidates:
        if c["pruned"]:
            m = c.get("measured") or {}
            rows.append(("-", c["label"], _fmt((c.get("predicted") or {}).get("step_s"), 1e3),
                         _fmt(m.get("step_s"), 1e3),
                         _fmt((c.get("memory_estimate") or {}).get("with_overhead"), 1 / 2**20, ".0f"),
                         _fmt(m.get("memory_bytes"), 1 / 2**20, ".0f"), c["pruned"][:90]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def print_ranking(state: Advice) -> None:
    n = sum(1 for c in state.candidates if c.get("rank"))
    k = sum(1 for c in state.candidates if c.get("measure"))
    for cell in state.calibration.cells:
        fw = cell["framework"]
        if cell.get("own_collectives") and fw in (state.calibration.comm_factor or {}):
            print(f"{fw}'s own collectives at {cell['ranks']} ranks: {1e3 * cell['comm_measured_s']:.1f} ms a step "
                  f"measured beyond its compute, {1e3 * cell['comm_priced_s']:.1f} ms priced for torch's -> "
                  f"its collectives priced x{state.calibration.comm_factor[fw]:.2f}")
    print(f"ranked {n} candidates by predicted step time; measuring {k}", flush=True)


def print_result(state: Advice, out: Path) -> None:
    print(table(state))
    rc = state.rank_correlation
    print(f"rank correlation (Spearman, predicted vs measured step time, {sum(1 for c in state.candidates if (c.get('measured') or {}).get('status') == 'ok')} runs): "
          f"{_fmt(rc, 1, '.2f')}")
    for fw, errs in sorted((state.memory_error_by_framework or {}).items()):
        print(f"memory estimate error {fw}: " + ", ".join(f"{e:+.0%}" for e in errs))
    if any((c.get("measured") or {}).get("memory_kind") == "host_rss" for c in state.candidates):
        print("memory: meas MiB is host RSS above the post-import baseline (CPU runs), est MiB a device-memory "
              "estimate; they are not compared (docs/memory-check.md checks the estimate on CPU with MemTracker)")
    ev = state.evaluation
    if ev and "regret" in ev:
        print(_evaluation_text(ev))
    rec = state.recommendation
    if rec:
        why = (f"reached the target first: {rec['time_to_target_s']:.2f} s" if rec.get("by") == "time_to_target_s"
               else "the fastest step")
        runs = rec.get("runs") or 1
        print(f"recommendation: {rec['label']} ({rec['samples_per_s']:.1f} samples/s measured"
              f"{f', median of {runs} runs' if runs > 1 else ''}; {why})\n  {margin_text(rec)}\n"
              f"  bench run {' '.join(rec['overrides'])}")
    print(f"advice: {out / ADVICE}   report: bench report {out}")


def margin_text(rec: dict) -> str:
    """How sure the recommendation is: the verdict rule's comparison with the runner-up
    (ddlbench.metrics.compare), or the tie it leaves."""
    if rec.get("runner_up") is None:
        return "the only candidate of the advice that ran"
    cmp = rec.get("comparison") or {}
    why = cmp.get("why") or "an advice from before the rank-sum rule: run it again"
    if rec.get("tie"):
        return (f"no clear winner: {', '.join(rec['tie'])} cannot be told apart by their runs (the best against "
                f"{rec['runner_up']}: {why}); any of them")
    if rec.get("settled"):
        return f"{rec['margin']:.1%} ahead of {rec['runner_up']}: {why}"
    return f"{rec['margin']:.1%} ahead of {rec['runner_up']}, not yet told apart: {why}"


def _evaluation_text(ev: dict) -> str:
    regrets = ", ".join(f"@{k} {_fmt(v, 1, '.3f')}" for k, v in ev["regret"].items())
    tau, ci = ev["kendall_tau_b"], ev["kendall_tau_b_interval"]
    cost = ev["cost"]
    lines = [f"evaluation ({ev['candidates']} candidates measured, {ev['feasible']} ran; true best {ev['best']}, by {ev['by']}):",
             f"  regret {regrets}; true best in the top: " + ", ".join(f"@{k} {'yes' if v else 'no'}"
                                                                       for k, v in ev["best_in_top"].items()),
             f"  the recommendation (failed candidates replaced, the two best repeated): regret "
             f"{_fmt(ev.get('regret_of_recommendation'), 1, '.3f')}" + _regret_interval_text(ev),
             "  infeasible in the top: " + ", ".join(f"@{k} {v}" for k, v in ev["infeasible_in_top"].items()),
             f"  Kendall tau-b {_fmt(tau, 1, '.2f')}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
             f"  spread (slowest / fastest) {ev['spread']:.2f}" + (" - every candidate within 5%: low regret is trivial here"
                                                                    if ev["trivial"] else ""),
             f"  cost to find: {cost['advice_device_s']:.0f} device-s (calibration + budget) vs {cost['grid_device_s']:.0f} "
             f"for the grid ({_fmt(cost['advice_over_grid'], 100, '.0f')}%; budget {cost['budget_fraction']:.0%} of the grid)"]
    return "\n".join(lines)


def _regret_interval_text(ev: dict) -> str:
    ci = ev.get("regret_of_recommendation_interval")
    if ci:
        return f" [{ci[0]:.3f}, {ci[1]:.3f}] over {ev['grid_runs']}+ interleaved runs of every candidate"
    return " (one run of some candidate: the true best is itself a draw of the noise; grid_repeats=3 gives an interval)"
