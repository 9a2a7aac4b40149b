"""What `bench advise` measures after its first round (pure; hand-checked in
tests/test_advise_rounds.py):

- a candidate of the advice's budget that fails (out of memory, crash, timeout) is a result, and
  the next candidate in predicted order is measured in its place (`advice_set`);
- the two best measured candidates are measured again (`run.repeat=N`, both in each round: A B A B)
  until the best is faster than the runner-up by the report's verdict rule
  (ddlbench.metrics.compare: the exact rank-sum test over their runs, p <= 0.05, which needs 3+ runs
  each), or each has `repeats` runs: then the answer is a tie (`decide`) among the candidates the
  runs cannot tell from the best;
- `evaluate=all` with `grid_repeats=R`: every candidate of the grid is measured until it has R runs,
  one run of each in every round (A B C A B C), so the regret has an interval (`grid_round`).

A candidate's runs are rows {'status', 'step_s', 'time_to_target_s', ...}; its value is the
median of its successful runs (lower is better), its speed per run 1 / value.
"""
from __future__ import annotations

from statistics import median

from ddlbench.metrics.compare import MIN_REPEATS, compare


def values(c: dict, key: str) -> list[float]:
    return [r[key] for r in c.get("runs") or () if r["status"] == "ok" and r.get(key) is not None]


def value(c: dict, key: str) -> float | None:
    v = values(c, key)
    return median(v) if v else None


def spread(c: dict, key: str) -> float | None:
    """Run-to-run spread of a candidate: slowest over fastest - 1 (None with fewer than two runs)."""
    v = values(c, key)
    return max(v) / min(v) - 1 if len(v) >= 2 and min(v) > 0 else None


def speeds(c: dict, key: str) -> list[float]:
    """One figure per successful run, higher is faster (what metrics.compare takes)."""
    return [1 / v for v in values(c, key) if v > 0]


def advice_set(ranked: list[dict], budget: int) -> list[dict]:
    """The candidates the advice measures: in predicted order until `budget` of them ran or are
    still to run; one that ran and failed every time is replaced by the next."""
    out, live = [], 0
    for c in ranked:
        if live >= budget:
            break
        out.append(c)
        runs = c.get("runs")
        if not runs or any(r["status"] == "ok" for r in runs):
            live += 1
    return out


def comparison(best: dict, other: dict, key: str) -> dict:
    """The verdict rule's comparison of the best against another candidate, as a record row."""
    cmp = compare(speeds(best, key), speeds(other, key))
    return {"ratio": cmp.ratio, "low": cmp.low, "high": cmp.high, "p": cmp.p, "runs": list(cmp.runs),
            "decided": cmp.decided and cmp.ratio > 1, "needed": cmp.needed, "why": cmp.why()}


def tie_of(ok: list[dict], key: str) -> list[str]:
    """The candidates the runs cannot tell from the best (`ok` sorted best first): the runner-up,
    every candidate with MIN_REPEATS+ runs the rank-sum test does not put behind the best, and every
    candidate with fewer runs whose median is no slower than the slowest run of those."""
    best = ok[0]
    tied = [best, ok[1]] + [c for c in ok[2:] if len(values(c, key)) >= MIN_REPEATS
                            and not comparison(best, c, key)["decided"]]
    slowest = max(v for c in tied for v in values(c, key))
    tied += [c for c in ok[2:] if len(values(c, key)) < MIN_REPEATS and value(c, key) <= slowest]
    ids = {c["id"] for c in tied}
    return [c["id"] for c in ok if c["id"] in ids]


def decide(ranked: list[dict], budget: int, key: str, repeats: int) -> dict:
    """The next round and the answer so far:
    {'measure': ids never measured, 'repeat': ids to measure again, 'best', 'runner_up': ids,
     'margin': runner-up / best - 1, 'spread': the larger of the two's run-to-run spreads,
     'comparison': the verdict rule's best against runner-up (`comparison`),
     'settled': the rule puts the best ahead, 'tie': ids it cannot tell apart once the repeats are spent}."""
    adv = advice_set(ranked, budget)
    out = {"measure": [c["id"] for c in adv if not c.get("runs")], "repeat": [], "best": None, "runner_up": None,
           "margin": None, "spread": None, "comparison": None, "settled": False, "tie": None}
    if out["measure"]:
        return out
    ok = sorted((c for c in adv if value(c, key) is not None), key=lambda c: value(c, key))
    if not ok:
        return out
    out["best"] = ok[0]["id"]
    if len(ok) == 1:
        out["settled"] = True                     # nothing to tell it from
        return out
    best, second = ok[0], ok[1]
    out["runner_up"] = second["id"]
    out["margin"] = value(second, key) / value(best, key) - 1
    spreads = [spread(c, key) for c in (best, second)]
    out["spread"] = max(spreads) if None not in spreads else None
    out["comparison"] = comparison(best, second, key)
    if out["comparison"]["decided"]:
        out["settled"] = True
        return out
    again = [c["id"] for c in (best, second) if len(c["runs"]) < repeats]
    if again:
        out["repeat"] = again
    else:
        out["tie"] = tie_of(ok, key)
    return out


def grid_round(ranked: list[dict], grid_repeats: int) -> list[list]:
    """evaluate=all's next round: [id, repeat index] for every candidate that ran (one successful
    run at least) and has the fewest runs, while that is under `grid_repeats`; [] when done. A
    candidate that failed is not measured again."""
    live = [c for c in ranked if any(r["status"] == "ok" for r in c.get("runs") or ())]
    if not live:
        return []
    fewest = min(len(c["runs"]) for c in live)
    if fewest >= grid_repeats:
        return []
    return [[c["id"], len(c["runs"])] for c in live if len(c["runs"]) == fewest]
