"""Goodput at scale (issue 67 item 5): the share of wall-clock time a job spends on training that
counts, once failures, the checkpoints that bound what a failure loses, and restarts are paid.

A job of N devices fails on average every MTTF(N) seconds. Meta's study of its clusters (arXiv
2410.21680) puts a 1,024-GPU job's mean time to failure near 8 hours and a 16,384-GPU job's near 2;
the default is the power law through those two points, MTTF(N) = 256 h / sqrt(N) (overridable).
A save costs the loop `cost` seconds (a sync save's blocked time; an async one's blocked time plus
the steps' slowdown over its write), every `interval` seconds of training. First order (Young 1974,
Daly 2006), per second of wall clock the job loses:
    cost / interval                      to saving,
    (interval + cost) / 2 / MTTF         to the work redone after a failure (half an interval on average),
    restart / MTTF                       to restarting (detection, relaunch, process group, load).
Young's optimal interval is sqrt(2 cost MTTF); Daly's refinement subtracts the cost.
"""
from __future__ import annotations

import math

HOUR = 3600.0
# (devices, mean time to failure in seconds): arXiv 2410.21680's figures the default fit passes through
PUBLISHED_MTTF = ((1024, 8 * HOUR), (16384, 2 * HOUR))


def mttf_fit(points=PUBLISHED_MTTF) -> tuple[float, float]:
    """(a, b) of MTTF(N) = a / N^b through two (devices, seconds) points."""
    (n1, m1), (n2, m2) = points
    b = math.log(m1 / m2) / math.log(n2 / n1)
    return m1 * n1 ** b, b


def mttf(devices: int, points=PUBLISHED_MTTF) -> float:
    """Mean time to failure of a job on `devices` devices, seconds."""
    a, b = mttf_fit(points)
    return a / devices ** b


def save_cost(blocked_s: float, slowdown: float | None = None, written_s: float | None = None) -> float:
    """What one save costs the loop: blocked seconds, plus for an async save the slowdown of the steps
    over the seconds it was being written (durable - blocked)."""
    return blocked_s + (slowdown or 0.0) * max(written_s or 0.0, 0.0)


def optimal_interval(cost_s: float, mttf_s: float) -> float:
    """Daly's optimum: sqrt(2 cost MTTF) - cost (Young's without the subtraction), at least the cost."""
    if cost_s <= 0:
        return 0.0
    return max(math.sqrt(2 * cost_s * mttf_s) - cost_s, cost_s)


def goodput(interval_s: float, cost_s: float, restart_s: float, mttf_s: float) -> float:
    """The share of wall clock that is useful training, first order (module docstring), at least 0."""
    if interval_s <= 0 or mttf_s <= 0:
        raise ValueError(f"goodput needs a positive checkpoint interval and MTTF (got {interval_s}, {mttf_s})")
    lost = cost_s / interval_s + (interval_s + cost_s) / 2 / mttf_s + restart_s / mttf_s
    return max(0.0, 1.0 - lost)
