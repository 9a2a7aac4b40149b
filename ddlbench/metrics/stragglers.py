"""Straggler detection (pure functions, hand-checked in tests/test_metrics.py).

In synchronous training every rank's step time equals the slowest rank's, so step times cannot
name a straggler. What differs per rank is when it becomes ready: the runner times, on every
rank, the host part of each step — from the end of the previous step to the call of the
framework's step (fetching the batch and whatever else the rank does before it can join the
collectives). All ranks leave a synchronous step together, so a rank whose host part is longer
than its peers' makes them wait by the difference.
"""
from __future__ import annotations

import statistics

DEFAULT_THRESHOLD = 0.10   # late by >= 10% of the median step time


def lateness(host_s: list[list[float]]) -> list[list[float]]:
    """Per rank and step: host time minus the fastest rank's host time in that step (seconds)."""
    if not host_s or any(len(h) != len(host_s[0]) for h in host_s):
        raise ValueError("need the same number of steps for every rank")
    fastest = [min(col) for col in zip(*host_s)]
    return [[h - f for h, f in zip(rank, fastest)] for rank in host_s]


def find_stragglers(host_s: list[list[float]], step_median_s: float,
                    threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Ranks whose median lateness is at least `threshold` of the median step time."""
    if step_median_s <= 0:
        raise ValueError("median step time must be positive")
    if not host_s or not host_s[0]:
        return {"late_median_s": [], "late_fraction": [], "flagged": [], "threshold": threshold}
    late = [statistics.median(r) for r in lateness(host_s)]
    frac = [l / step_median_s for l in late]
    return {"late_median_s": late, "late_fraction": frac,
            "flagged": [r for r, f in enumerate(frac) if f >= threshold], "threshold": threshold}


def describe(found: dict) -> list[str]:
    """One warning line per flagged rank."""
    return [f"straggler: rank {r} joins each step {found['late_median_s'][r] * 1e3:.0f} ms after the "
            f"fastest rank (median; {found['late_fraction'][r]:.0%} of the step), so its peers wait for it"
            for r in found["flagged"]]
