"""What `bench advise` measures after its first round (pure; hand-checked in
tests/test_advise_rounds.py):

- a candidate of the advice's budget that fails (out of memory, crash, timeout) is a result, and
  the next candidate in predicted order is measured in its place (`advice_set`);
- the two best measured candidates are measured again (`run.repeat=N`) until the recommendation's
  margin over the runner-up exceeds the run-to-run spread of both, or each has `repeats` runs:
  then the answer is a tie among every candidate within that spread of the best (`decide`).

A candidate's runs are rows {'status', 'step_s', 'time_to_target_s', ...}; its value is the
median of its successful runs, its spread (slowest / fastest - 1) needs two of them.
"""
from __future__ import annotations

from statistics import median


def values(c: dict, key: str) -> list[float]:
    return [r[key] for r in c.get("runs") or () if r["status"] == "ok" and r.get(key) is not None]


def value(c: dict, key: str) -> float | None:
    v = values(c, key)
    return median(v) if v else None


def spread(c: dict, key: str) -> float | None:
    """Run-to-run spread of a candidate: slowest over fastest - 1 (None with fewer than two runs)."""
    v = values(c, key)
    return max(v) / min(v) - 1 if len(v) >= 2 and min(v) > 0 else None


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


def decide(ranked: list[dict], budget: int, key: str, repeats: int) -> dict:
    """The next round and the answer so far:
    {'measure': ids never measured, 'repeat': ids to measure again, 'best', 'runner_up': ids,
     'margin': runner-up / best - 1, 'spread': the larger of the two's, 'settled': margin > spread,
     'tie': ids within the spread of the best when repeats could not settle it (else None)}."""
    adv = advice_set(ranked, budget)
    out = {"measure": [c["id"] for c in adv if not c.get("runs")], "repeat": [], "best": None, "runner_up": None,
           "margin": None, "spread": None, "settled": False, "tie": None}
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
    if all(s is not None for s in spreads):
        out["spread"] = max(spreads)
        if out["margin"] > out["spread"]:
            out["settled"] = True
            return out
    again = [c["id"] for c in (best, second) if len(c["runs"]) < repeats]
    if again:
        out["repeat"] = again
    elif out["spread"] is not None:
        limit = value(best, key) * (1 + out["spread"])
        out["tie"] = [c["id"] for c in ok if value(c, key) <= limit]
    return out
