"""Repeat statistics: median with a percentile-bootstrap confidence interval (pure, seeded)."""
from __future__ import annotations

import numpy as np

MIN_CI_REPEATS = 5   # below this a bootstrap interval of the median is only [min, max]


def _finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def bootstrap_median_ci(values, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple:
    """(median, low, high). Percentile bootstrap of the median, from MIN_CI_REPEATS values on;
    with fewer the interval is (nan, nan): 2-4 resampled medians span little more than
    [min, max], which is not a 95% interval (repeat_range() says what they show)."""
    x = _finite(values)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    med = float(np.median(x))
    if len(x) < MIN_CI_REPEATS:
        return med, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    meds = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    alpha = (1 - level) / 2
    return med, float(np.quantile(meds, alpha)), float(np.quantile(meds, 1 - alpha))


def repeat_range(values) -> tuple:
    """(min, max, n) of the finite values: what fewer than MIN_CI_REPEATS repeats can show."""
    x = _finite(values)
    return (float(x.min()), float(x.max()), len(x)) if len(x) else (float("nan"), float("nan"), 0)


def spearman(xs, ys) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None below 3 pairs or when one side
    is constant."""
    import pandas as pd

    pairs = [(float(x), float(y)) for x, y in zip(xs, ys)
             if x is not None and y is not None and np.isfinite(x) and np.isfinite(y)]
    if len(pairs) < 3:
        return None
    rx = pd.Series([p[0] for p in pairs]).rank().to_numpy()
    ry = pd.Series([p[1] for p in pairs]).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
