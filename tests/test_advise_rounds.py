"""`bench advise` after its first round (ddlbench.advise.rounds), by hand: a failed candidate of the
budget is replaced by the next in predicted order; the two best are measured again until the
report's verdict rule (the rank-sum test, ddlbench.metrics.compare) puts the best ahead, or the
answer is a tie; evaluate=all's grid rounds interleave every candidate's runs."""
from __future__ import annotations

import pytest

from ddlbench.advise.regret import regret_interval
from ddlbench.advise.rounds import advice_set, decide, grid_round, spread, value


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
    assert d["measure"] == ["c3"] and d["best"] is None          # nothing decided wdef test_the_two_best_are_repeated_until_the_rank_sum_test_puts_one_ahead():
    # one run each: nothing can be told, measure both again
    d = decide([cand(1, 1.00), cand(2, 1.02), cand(3, 1.5)], 3, "step_s", 3)
    assert (d["best"], d["runner_up"], d["repeat"]) == ("c1", "c2", ["c1", "c2"])
    assert d["margin"] == pytest.approx(0.02) and d["spread"] is None and not d["settled"]
    assert d["comparison"]["runs"] == [1, 1] and not d["comparison"]["decided"]
    # two runs each, every run of c1 faster: still too few for p <= 0.05 (the best split of 2+2 is 1/6)
    d = decide([cand(1, 1.00, 1.01), cand(2, 1.10, 1.11), cand(3, 1.5)], 3, "step_s", 3)
    assert d["repeat"] == ["c1", "c2"] and not d["settled"] and d["comparison"]["p"] == pytest.approx(1 / 6)
    # three each, every run of c1 faster than every run of c2: p = 1 / C(6, 3) = 0.05 - settled
    d = decide([cand(1, 1.00, 1.01, 1.02), cand(2, 1.10, 1.11, 1.12), cand(3, 1.5)], 3, "step_s", 3)
    assert d["settled"] and d["repeat"] == [] and d["tie"] is None
    assert d["comparison"]["p"] == pytest.approx(0.05) and d["comparison"]["ratio"] == pytest.approx(1.11 / 1.01)
    assert d["spread"] == pytest.approx(0.02) and d["margin"] == pytest.approx(1.11 / 1.01 - 1)


def test_a_tie_lists_every_candidate_the_runs_cannot_tell_from_the_best():
    # three runs each and overlapping: medians 1.02 (c1), 1.03 (c2); c3 once at 1.04, no slower than the
    # tie's slowest run (1.05): in; c4 once at 1.20: out; c5's three runs all slower than c1's: out (p = 0.05)
    ranked = [cand(1, 1.00, 1.04, 1.02), cand(2, 1.02, 1.03, 1.05), cand(3, 1.04), cand(4, 1.20),
              cand(5, 1.30, 1.31, 1.32)]
    d = decide(ranked, 5, "step_s", 3)
    assert d["repeat"] == [] and not d["settled"] and d["tie"] == ["c1", "c2", "c3"]
    assert not d["comparison"]["decided"] and d["comparison"]["needed"] is not None


def test_without_repeats_the_two_best_tie():
    d = decide([cand(1, 1.0), cand(2, 1.01), cand(3, 1.2)], 3, "step_s", 1)
    assert d["repeat"] == [] and d["tie"] == ["c1", "c2"] and d["spread"] is None and not d["settled"]
    assert "too few to tell" in d["comparison"]["why"]
    # one candidate ran: nothing to tell it from
    d = decide([cand(1, 1.0), cand(2, failed=1)], 2, "step_s", 3)
    assert d["best"] == "c1" and d["runner_up"] is None and d["settled"]


def test_the_grid_is_measured_again_one_run_of_each_per_round():
    a, b, c, e = cand(1, 1.0, 1.1, 1.0), cand(2, 2.0), cand(3, failed=1), cand(4, 3.0)
    assert grid_round([a, b, c, e], 3) == [["c2", 1], ["c4", 1]]      # the failed one is not repeated
    b["runs"].append({"status": "ok", "step_s": 2.1})
    assert grid_round([a, b, c, e], 3) == [["c4", 1]]                 # the fewest runs first
    e["runs"].append({"status": "ok", "step_s": 3.1})
    assert grid_round([a, b, c, e], 3) == [["c2", 2], ["c4", 2]]
    assert grid_round([a, b, c, e], 2) == [] and grid_round([c], 3) == []


def test_the_regret_interval_by_hand():
    # no noise: the interval is the point, 1 / 0.9
    assert regret_interval([[1, 1, 1], [0.9, 0.9, 0.9]], 0) == pytest.approx((1 / 0.9, 1 / 0.9))
    # the other's median of 3 draws from {0.95, 1.05, 1.2} is 0.95 with probability 7/27 (26%, above
    # the 2.5% tail): regret in [1.0, 1 / 0.95]
    lo, hi = regret_interval([[1, 1, 1], [0.95, 1.05, 1.2]], 0)
    assert (lo, hi) == pytest.approx((1.0, 1 / 0.95))
    assert regret_interval([[1, 1], [0.9]], 0) is None                 # one run: its noise is unknown


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
    # two runs each can never pass the rank-sum test (MIN_REPEATS 3): a tie of the two, said so
    assert (rec_["id"], rec_["runner_up"], rec_["runs"], rec_["settled"]) == ("c3", "x2", 2, False)
    assert rec_["tie"] == ["x3", "x2"] and "2 and 2 runs: too few" in rec_["comparison"]["why"]
    assert rec_["margin"] == pytest.approx(0.305 / 0.205 - 1) and rec_["spread"] == pytest.approx(0.05)
    assert rec_["advice"] == ["x1", "x2", "x3"]
    assert state.candidates[0]["measured"]["status"] == "oom" and "measured" not in state.candidates[3]
