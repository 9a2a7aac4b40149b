"""How good a recommendation is, judged against an exhaustive grid (pure; tested on AMP's
published exhaustive log in tests/test_regret.py).

    regret@k = best measured step among the k candidates predicted fastest / best measured of all

A failed or out-of-memory candidate counts as infinitely slow: it is in the top k, costs its
measurement, and cannot be the answer (infeasible@k counts them). regret@k is infinite when all of
the top k failed. Kendall's tau-b (ties handled) between predicted and measured step times over
the feasible candidates, with a percentile bootstrap interval; the grid's spread (slowest over
fastest feasible): where everything is within 5%, any pick has low regret, and the report says so.
"""
from __future__ import annotations

import math
import random
from typing import Optional, Sequence

TRIVIAL_SPREAD = 1.05


def feasible(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x)


def ranked(predicted: Sequence[float], measured: Sequence[Optional[float]]) -> list[Optional[float]]:
    """The measured times in the order of the predictions (fastest predicted first; a stable sort
    keeps the given order among equal predictions)."""
    if len(predicted) != len(measured):
        raise ValueError("one measured time per prediction")
    order = sorted(range(len(predicted)), key=lambda i: predicted[i])
    return [measured[i] for i in order]


def regret_at(predicted: Sequence[float], measured: Sequence[Optional[float]], k: int) -> float:
    ok = [m for m in measured if feasible(m)]
    if not ok:
        raise ValueError("no candidate ran: regret is undefined")
    top = [m for m in ranked(predicted, measured)[:k] if feasible(m)]
    return min(top) / min(ok) if top else math.inf


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """tau-b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)); None when either
    side is constant (or fewer than 2 pairs)."""
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                tx, ty = tx + 1, ty + 1
            elif dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    n0 = n * (n - 1) // 2
    denom = math.sqrt((n0 - tx) * (n0 - ty))
    return (conc - disc) / denom if denom else None


def bootstrap_interval(x: Sequence[float], y: Sequence[float], stat=kendall_tau_b, samples: int = 1000,
                       level: float = 0.95, seed: int = 0) -> Optional[tuple[float, float]]:
    """Percentile bootstrap over (x, y) pairs resampled with replacement; deterministic (seed)."""
    if len(x) < 3:
        return None
    rng = random.Random(seed)
    n, values = len(x), []
    for _ in range(samples):
        idx = [rng.randrange(n) for _ in range(n)]
        v = stat([x[i] for i in idx], [y[i] for i in idx])
        if v is not None:
            values.append(v)
    if not values:
        return None
    values.sort()
    lo = values[int((1 - level) / 2 * (len(values) - 1))]
    hi = values[int((1 + level) / 2 * (len(values) - 1))]
    return lo, hi


def evaluate(predicted: Sequence[float], measured: Sequence[Optional[float]], ks: Sequence[int] = (1, 3, 5),
             budget: Optional[int] = None) -> dict:
    """The evaluation of one exhaustive grid: regret@k (and @budget), whether the true best is in
    the top k, infeasible@k, Kendall tau-b with its interval, the spread."""
    order = ranked(predicted, measured)
    ok = [m for m in measured if feasible(m)]
    best = min(ok)
    ks = sorted({*ks, *([budget] if budget else [])})
    pairs = [(p, m) for p, m in zip(predicted, measured) if feasible(m)]
    px, my = [p for p, _ in pairs], [m for _, m in pairs]
    spread = max(ok) / best
    return {
        "candidates": len(measured), "feasible": len(ok), "best_measured": best,
        "regret": {str(k): regret_at(predicted, measured, k) for k in ks},
        "best_in_top": {str(k): best in order[:k] for k in ks},
        "infeasible_in_top": {str(k): sum(not feasible(m) for m in order[:k]) for k in ks},
        "kendall_tau_b": kendall_tau_b(px, my), "kendall_tau_b_interval": bootstrap_interval(px, my),
        "spread": spread, "trivial": spread <= TRIVIAL_SPREAD, "budget": budget,
    }


def regret_interval(grid: Sequence[Sequence[float]], chosen: int, level: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> Optional[tuple[float, float]]:
    """The percentile-bootstrap interval of a recommendation's regret, median(grid[chosen]) / the
    best median of the grid (each row a candidate's runs; lower is better): every row resampled
    within itself. None while a candidate has fewer than two runs (its noise unknown)."""
    import numpy as np
    rows = [np.asarray(r, dtype=float) for r in grid]
    if not rows or any(len(r) < 2 for r in rows):
        return None
    rng = np.random.default_rng(seed)
    medians = np.stack([np.median(r[rng.integers(0, len(r), size=(resamples, len(r)))], axis=1) for r in rows])
    boot = medians[chosen] / medians.min(axis=0)
    alpha = (1 - level) / 2
    return float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))
