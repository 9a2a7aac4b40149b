"""`bench advise` after its first round (ddlbench.advise.rounds), by hand: a failed candidate of the
budget is replaced by the next in predicted order; the two best are measured again until the
margin between them exceeds both's run-to-run spread, or the answer is a tie."""
from __future__ import annotations

import pytest

from ddlbench.advise.rounds import advice_set, decide, spread, value


def cand(i: int, *steps, failed: int = 0) -> dict:
    runs = [{"status": "failed", "step_s": None}] * failed + [{"status": "ok", "step_s": s} for s in steps]
    return {"id": f"c{i}", "rank": i, **({"runs": runs} if runs else {})}


def test_value_is_the_median_and_spread_needs_two_runs():
    assert value(cand(1, 1.0, 3.0, 1.2), "step_s") == 1.2
    assert spread(cand(1, 1.0), "step_s") is None
    assert spread(cand(1, 1.0, 1.1), "step_s") == pytest.approx(0.1)
    assert value(cand(1, failed=2), "step_s") is None


def test_a_failed_candidate_is_replaced_by_the_next():
    ranked = [cand(1, failed=1), cand(2, 1.0), cand(3), cand(4)]
    assert [c["id"] for c in advice_set(ranked, 2)] == ["c1", "c2", "c3"]
    d = decide(ranked, 2, "step_s", 3)
    assert d["measure"] == ["c3"] and d["best"] is None          # nothing decided while c3 is to run
    # a failure that later succeeded counts as run
    assert [c["id"] for c in advice_set([cand(1, 1.0, failed=1), cand(2)], 1)] == ["c1"]


def test_the_two_best_are_repeated_until_the_margin_exceeds_their_noise():
    # one run each: the noise is unknown, measure both again
    d = decide([cand(1, 1.00), cand(2, 1.02), cand(3, 1.5)], 3, "step_s", 3)
    assert (d["best"], d["runner_up"], d["repeat"]) == ("c1", "c2", ["c1", "c2"])
    assert d["margin"] == pytest.approx(0.02) and d["spread"] is None and not d["settled"]
    # two runs each: spreads 1% and 0.5%; medians 1.005 and 1.0225: margin 1.74% > 1% - settled
    d = decide([cand(1, 1.00, 1.01), cand(2, 1.02, 1.025), cand(3, 1.5)], 3, "step_s", 3)
    assert d["settled"] and d["repeat"] == [] and d["tie"] is None
    assert d["spread"] == pytest.approx(0.01) and d["margin"] == pytest.approx(1.0225 / 1.005 - 1)
    # margin 1.5% within a 4% spread: again, until the most runs
    d = decide([cand(1, 1.00, 1.04), cand(2, 1.035, 1.04)], 2, "step_s", 3)
    assert d["repeat"] == ["c1", "c2"] and not d["settled"]


def test_a_tie_lists_every_candidate_within_the_spread():
    # three runs each and still within the noise: medians 1.02, 1.03, 1.04 (c3, once), 1.20;
    # spread = max(4%, 2%) = 4%: c1, c2 and c3 (1.04 <= 1.02 x 1.04) tie, c4 does not
    ranked = [cand(1, 1.00, 1.02, 1.04), cand(2, 1.02, 1.03, 1.04), cand(3, 1.04), cand(4, 1.20)]
    d = decide(ranked, 4, "step_s", 3)
    assert d["repeat"] == [] and not d["settled"]
    assert d["spread"] == pytest.approx(0.04) and d["tie"] == ["c1", "c2", "c3"]


def test_without_repeats_the_noise_stays_unknown():
    d = decide([cand(1, 1.0), cand(2, 1.01)], 2, "step_s", 1)
    assert d["repeat"] == [] and d["tie"] is None and d["spread"] is None and not d["settled"]
    # one candidate ran: nothing to tell it from
    d = decide([cand(1, 1.0), cand(2, failed=1)], 2, "step_s", 3)
    assert d["best"] == "c1" and d["runner_up"] is None and d["settled"]


def test_resume_measures_the_replacement_then_the_repeats():
    """bench advise's next rounds from its state: c1 ran out of memory, so c3 runs in its place;
    then the two best (c2, c3) run again as run.repeat=1; then the answer."""
    from ddlbench.advise.conclude import collect, fold, next_round
    from ddlbench.advise.state import Advice

    def rec(step):
        if step is None:
            return {"status": "oom", "error": {"message": "out of memory"}}
        return {"status": "ok", "timing": {"step_time_s": {"median": step}}, "throughput": {"samples_per_s": 8 / step},
                "memory": {"per_rank": [{"peak_allocated_bytes": 80}]}}
    state = Advice(options={"budget_runs": 2, "repeats": 2},
                   candidates=[{"id": f"c{i}", "label": f"x{i}", "framework": "ddp", "overrides": [f"o{i}"], "rank": i,
                                "pruned": None, "predicted": {"step_s": 0.1 * i}, "memory_estimate": {"with_overhead": 100}}
                               for i in (1, 2, 3, 4)])
    fold(state, ["c1", "c2"], [rec(None), rec(0.30)])
    assert next_round(state) == ([["c3", 0]], "in place of failed candidates")
    fold(state, ["c3"], [rec(0.20)])
    assert next_round(state)[0] == [["c3", 1], ["c2", 1]]
    fold(state, ["c3", "c2"], [rec(0.21), rec(0.31)])
    assert next_round(state) == ([], "")
    collect(state)
    rec_ = state.recommendation
    assert (rec_["id"], rec_["runner_up"], rec_["runs"], rec_["settled"]) == ("c3", "x2", 2, True)
    assert rec_["margin"] == pytest.approx(0.305 / 0.205 - 1) and rec_["spread"] == pytest.approx(0.05)
    assert rec_["advice"] == ["x1", "x2", "x3"]
    assert state.candidates[0]["measured"]["status"] == "oom" and "measured" not in state.candidates[3]
