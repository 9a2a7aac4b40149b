"""Repeat statistics: median with a percentile-bootstrap confidence interval (pure, seeded)."""
from __future__ import annotations

import numpy as np


def bootstrap_median_ci(values, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple:
    """(median, low, high). Percentile bootstrap of the median; with fewer than 2 values the
    interval is (nan, nan): one run says nothing about spread."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    med = float(np.median(x))
    if len(x) < 2:
        return med, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    meds = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    alpha = (1 - level) / 2
    return med, float(np.quantile(meds, alpha)), float(np.quantile(meds, 1 - alpha))
