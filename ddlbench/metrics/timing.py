"""Step-time statistics (docs/design.md §5): per step, the global time is the max over ranks."""
from __future__ import annotations

import math
from typing import Sequence


def global_step_times(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """per_rank[r][i] = rank r's time for step i -> max over ranks per step."""
    if not per_rank:
        raise ValueError("no ranks")
    n = len(per_rank[0])
    if any(len(r) != n for r in per_rank):
        raise ValueError("ranks recorded different numbers of steps")
    return [max(r[i] for r in per_rank) for i in range(n)]


def window_step_time(per_rank: Sequence[Sequence[float]]) -> float:
    """The unbiased global step time: each rank's measured window (the sum of its boundary-to-
    boundary step times: start of its first measured step to the end of its last, evaluation
    pauses excluded), MAX over ranks, divided by the steps. A sum of per-step maxima would
    over-count: when ranks' step boundaries drift, each step's max picks a different rank."""
    if not per_rank or not per_rank[0]:
        raise ValueError("no measured steps")
    return max(sum(r) for r in per_rank) / len(per_rank[0])


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not sorted_values:
        raise ValueError("empty")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(times: Sequence[float]) -> dict:
    """median, mean, p10, p90, std (population), min, max of a series."""
    if not times:
        raise ValueError("no measured steps")
    s = sorted(times)
    mean = sum(s) / len(s)
    std = math.sqrt(sum((t - mean) ** 2 for t in s) / len(s))
    return {"median": percentile(s, 50), "mean": mean, "p10": percentile(s, 10),
            "p90": percentile(s, 90), "std": std, "min": s[0], "max": s[-1]}


def mean_ignoring_missing(values: Sequence[float]) -> float:
    """Mean over ranks that hold a value (NaN or None = the rank holds no loss, e.g. a pipeline
    stage; None is how strict JSON keeps it)."""
    held = [v for v in values if v is not None and not math.isnan(v)]
    return sum(held) / len(held) if held else float("nan")


def window_vs_median(window_step_s: float, stats: dict, steps: int | None = None) -> dict:
    """The window's mean step (what throughput and MFU use) against the median step, and whether
    they differ by more than the run's own spread, half the p10-p90 range: one slow step in a short
    window (an allocator growing, a collection) moves the mean and not the median. Both figures
    are kept; the flag says which to trust less. With the window's step count, also how much the
    slowest step alone moves the window's figure: (its time - the median) / the window's seconds."""
    median = stats["median"]
    spread = (stats["p90"] - stats["p10"]) / 2
    differs = window_step_s - median
    out = {"window_step_s": window_step_s, "median_step_s": median,
           "window_over_median": window_step_s / median if median > 0 else None,
           "spread_s": spread, "outlier": abs(differs) > spread,
           "rule": "outlier when |window mean step - median step| > (p90 - p10) / 2 of the measured steps"}
    if steps:
        window_s = window_step_s * steps
        out["window_s"] = window_s
        out["slowest_step_moves"] = max(stats["max"] - median, 0.0) / window_s if window_s > 0 else None
    return out
