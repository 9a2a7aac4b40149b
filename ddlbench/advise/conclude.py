"""`bench advise`, phase 3: measured runs folded into their candidates, the next round decided,
predicted vs measured compared, the recommendation and (evaluate=all) the evaluation."""
from __future__ import annotations

import math

from ddlbench.advise.state import Advice


def device_seconds(r: dict) -> float:
    """What a run cost: its ranks x (start-up to the first step + the timed window's wall time);
    probes and teardown are left out (the same for every candidate)."""
    start = (r.get("startup_s") or {}).get("total_to_first_step") or 0.0
    wall = (r.get("timing") or {}).get("wall_s") or 0.0
    return ((r.get("parallel") or {}).get("world_size") or 1) * (start + wall)


def _run_row(r: dict) -> dict:
    from ddlbench.report.frame import training_memory_bytes
    row = {"status": r["status"], "run_id": r.get("run_id"), "device_s": device_seconds(r),
           "error": (r.get("error") or {}).get("message") if r["status"] != "ok" else None}
    if r["status"] == "ok":
        row.update({"step_s": float(r["timing"]["step_time_s"]["median"]),
                    "samples_per_s": r["throughput"].get("samples_per_s"), "memory_bytes": training_memory_bytes(r),
                    "memory_kind": "device" if any(m.get("peak_allocated_bytes") is not None
                                                   for m in r["memory"].get("per_rank") or []) else "host_rss",
                    "time_to_target_s": (r.get("convergence") or {}).get("time_to_target_s")})
    return row


def fold(state: Advice, ids: list[str], results: list[dict]) -> None:
    """One round's results, in the order of its cells, as runs of their candidates."""
    by_id = {c["id"]: c for c in state.candidates}
    for cid, r in zip(ids, results):
        by_id[cid].setdefault("runs", []).append(_run_row(r))


def _ranked(state: Advice) -> list[dict]:
    return sorted((c for c in state.candidates if c.get("rank") and not c.get("pruned")), key=lambda c: c["rank"])


def _key(state: Advice) -> str:
    """With experiment= (a quality target) the first to reach the target wins; else the fastest step."""
    from ddlbench.advise.rounds import value
    ok = [c for c in state.candidates if value(c, "step_s") is not None and not c.get("verify_pruned")]
    return "time_to_target_s" if ok and all(value(c, "time_to_target_s") is not None for c in ok) else "step_s"


def next_round(state: Advice) -> tuple[list[list], str]:
    """([candidate id, repeat index] to measure next, why): failed candidates of the budget
    replaced, the two best repeated until their order is clear, then (evaluate=all with
    grid_repeats) the grid's runs interleaved (ddlbench.advise.rounds)."""
    from ddlbench.advise.rounds import decide, grid_round
    d = decide(_ranked(state), _budget(state), _key(state), state.options.get("repeats", 1))
    state.decision = d
    by_id = {c["id"]: c for c in state.candidates}
    if d["measure"]:
        return [[i, 0] for i in d["measure"]], "in place of failed candidates"
    if d["repeat"]:
        return [[i, len(by_id[i]["runs"])] for i in d["repeat"]], "again: the two best are not yet told apart"
    if state.options.get("evaluate") == "all":
        cells = grid_round(_grid(state), state.options.get("grid_repeats", 1))
        if cells:
            return cells, f"the grid, run {cells[0][1] + 1} of each"
    return [], ""


def _grid(state: Advice) -> list[dict]:
    """evaluate=all's grid: every ranked candidate that was measured, in predicted order."""
    return sorted((c for c in state.candidates if c.get("rank") and c.get("runs")), key=lambda c: c["rank"])


def _measured(c: dict) -> dict:
    """A candidate's runs in one row: medians of its successful runs, the last failure if none."""
    from ddlbench.advise.rounds import value
    runs = c["runs"]
    ok = [r for r in runs if r["status"] == "ok"]
    m = dict(ok[0] if ok else runs[-1])
    if ok:
        ttt = [r["time_to_target_s"] for r in ok]
        m.update({"step_s": value(c, "step_s"), "samples_per_s": value(c, "samples_per_s"),
                  "time_to_target_s": value(c, "time_to_target_s") if None not in ttt else None,
                  "memory_bytes": max((r["memory_bytes"] for r in ok if r["memory_bytes"]), default=None),
                  "step_s_runs": [r["step_s"] for r in ok]})
    m.update({"runs": len(runs), "device_s": sum(r["device_s"] for r in runs)})
    return m


def collect(state: Advice) -> None:
    from ddlbench.metrics.stats import spearman

    chosen = [c for c in state.candidates if c.get("runs")]
    for c in chosen:
        m = _measured(c)
        if m["status"] == "ok":
            # an error only where the measurement is what the estimate is of: device memory. On
            # CPU the measurement is host RSS (allocator caches, threads, the framework's host side)
            if m["memory_bytes"] and m.get("memory_kind", "device") == "device":
                est = c["memory_estimate"]["with_overhead"]
                m["memory_error"] = (est - m["memory_bytes"]) / m["memory_bytes"]
            m["step_error"] = (c["predicted"]["step_s"] - m["step_s"]) / m["step_s"]
        c["measured"] = m
    ok = [c for c in chosen if c["measured"]["status"] == "ok" and c.get("predicted") and not c.get("verify_pruned")]
    state.rank_correlation = spearman([c["predicted"]["step_s"] for c in ok], [c["measured"]["step_s"] for c in ok])
    by = {}
    for c in chosen:
        e = (c.get("measured") or {}).get("memory_error")
        if e is not None:
            by.setdefault(c["framework"], []).append(e)
    state.memory_error_by_framework = by
    key = _key(state)
    state.recommendation = recommendation(state, key)
    if state.options.get("evaluate") == "all":
        state.evaluation = evaluation(state, key)


def recommendation(state: Advice, key: str) -> dict | None:
    """The best the advice measured (its budget, failed candidates replaced), with its margin over
    the runner-up and the verdict rule's comparison of the two; a tie lists every candidate the
    runs cannot tell from the best (ddlbench.advise.rounds)."""
    from ddlbench.advise.rounds import decide
    d = decide(_ranked(state), _budget(state), key, state.options.get("repeats", 1))
    by_id = {c["id"]: c for c in state.candidates}
    best = by_id.get(d["best"])
    if best is None:
        return None
    m = best["measured"]
    return {"id": best["id"], "label": best["label"], "overrides": best["overrides"], "by": key,
            "measured_step_s": m["step_s"], "time_to_target_s": m["time_to_target_s"], "samples_per_s": m["samples_per_s"],
            "runs": m["runs"], "runner_up": by_id[d["runner_up"]]["label"] if d["runner_up"] else None,
            "margin": d["margin"], "spread": d["spread"], "settled": d["settled"], "comparison": d["comparison"],
            "tie": [by_id[i]["label"] for i in d["tie"]] if d["tie"] else None,
            "advice": [c["label"] for c in _advice(state)]}


def _advice(state: Advice) -> list[dict]:
    from ddlbench.advise.rounds import advice_set
    return advice_set(_ranked(state), _budget(state))


def _budget(state: Advice) -> int:
    """The advice's budget of measured candidates (a state without options: all of them)."""
    return state.options.get("budget_runs", len(state.candidates))


def evaluation(state: Advice, key: str) -> dict:
    """evaluate=all: the advice (its top budget_runs by prediction) against every candidate
    measured (ddlbench.advise.regret), and what finding it cost against measuring the grid."""
    from ddlbench.advise.regret import evaluate, regret_interval
    from ddlbench.advise.rounds import values
    ranked = sorted((c for c in state.candidates if c.get("rank") and c.get("measured")), key=lambda c: c["rank"])
    if not any(c["measured"]["status"] == "ok" for c in ranked):
        return {"error": "no candidate ran"}
    budget = state.options["budget_runs"]
    measured = [c["measured"][key] if c["measured"]["status"] == "ok" else math.inf for c in ranked]
    out = evaluate([c["predicted"]["step_s"] for c in ranked], measured, budget=budget or None)
    out["regret"] = {k: (v if math.isfinite(v) else None) for k, v in out["regret"].items()}   # None: all of the top k failed
    advice = _advice(state)
    # the advice: calibration, its budget (failed ones replaced) with their repeats; the grid: grid_repeats
    # runs each (the advice's extra repeats of its two best are not the grid's)
    repeats = state.options.get("grid_repeats", 1)
    advice_s = state.calibration.device_s + sum(c["measured"]["device_s"] for c in advice)
    grid_s = sum(r["device_s"] for c in ranked for r in c["runs"][:repeats])
    out.update({"by": key, "best": next(c["label"] for c, m in zip(ranked, measured) if m == out["best_measured"]),
                "advice": [c["label"] for c in advice],
                "cost": {"advice_device_s": advice_s, "grid_device_s": grid_s,
                         "advice_over_grid": advice_s / grid_s if grid_s else None,
                         "budget_fraction": budget / len(ranked)}})
    rec = state.recommendation
    chosen = (rec["measured_step_s"] if key == "step_s" else rec["time_to_target_s"]) if rec else None
    out["regret_of_recommendation"] = chosen / out["best_measured"] if chosen else None
    # its interval: each candidate's runs resampled (None while any candidate that ran has one run)
    ran = [c for c in ranked if c["measured"]["status"] == "ok"]
    out["grid_runs"] = min(len(values(c, key)) for c in ran)
    mine = [i for i, c in enumerate(ran) if rec and c["id"] == rec["id"]]
    out["regret_of_recommendation_interval"] = (regret_interval([values(c, key) for c in ran], mine[0])
                                                if mine else None)
    return out
