"""Is one configuration faster than another, or within the run-to-run noise? (pure)

The unit of evidence is a run: one throughput figure per repeat of a configuration, the repeats
of the configurations compared interleaved in time (A B A B ..., not A A B B: a machine that drifts
then moves both alike). Within-run steps are not independent draws of the noise between runs and
are never pooled for this.

- The test: the exact one-sided Wilcoxon rank-sum (Mann-Whitney) test of "A's runs are faster than
  B's", mid-ranks for ties, its p-value counted over every split of the pooled runs (no normal
  approximation: the counts here are small). A is called faster when p <= ALPHA; with 3 runs
  each that needs every run of A above every run of B (p = 1/20).
- The effect: the ratio of median throughputs, with a seeded percentile-bootstrap interval (runs
  resampled within each configuration).
- What would separate an undecided pair: the repeats per configuration a one-sided test at ALPHA
  needs to see the observed ratio with 80% power, at the observed spread between runs (the log
  throughput's pooled standard deviation; the rank test's 3/pi efficiency against the t-test).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
MIN_REPEATS = 3          # fewer runs a side cannot reach p <= ALPHA
MAX_USEFUL_REPEATS = 100  # beyond this the verdict says the difference is too small to chase
POWER_Z = 1.6449 + 0.8416    # z(1 - ALPHA) + z(0.8)
RANK_EFFICIENCY = 3 / math.pi  # Wilcoxon vs t under normal noise (asymptotic relative efficiency)


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and np.isfinite(v)]


def rank_sum_p(a, b) -> float:
    """Exact one-sided p-value of the rank-sum test that `a` tends to exceed `b`: the share of the
    C(n+m, n) ways to pick n of the pooled values whose mid-rank sum is at least a's. 1.0 when
    either side is empty."""
    a, b = _finite(a), _finite(b)
    if not a or not b:
        return 1.0
    pooled = sorted(a + b)
    # doubled mid-ranks: integers even with ties
    twice = {}
    i = 0
    while i < len(pooled):
        j = i
        while j < len(pooled) and pooled[j] == pooled[i]:
            j += 1
        twice[pooled[i]] = i + 1 + j      # 2 x the mean of ranks i+1 .. j
        i = j
    ranks = [twice[v] for v in pooled]
    observed = sum(twice[v] for v in a)
    n, total = len(a), sum(ranks)
    # ways[k][s]: subsets of k ranks summing to s
    ways = [[0] * (total + 1) for _ in range(n + 1)]
    ways[0][0] = 1
    for r in ranks:
        for k in range(n, 0, -1):
            row, below = ways[k], ways[k - 1]
            for s in range(total, r - 1, -1):
                if below[s - r]:
                    row[s] += below[s - r]
    at_least = sum(ways[n][observed:])
    return at_least / math.comb(len(ranks), n)


def ratio_interval(a, b, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(median(a) / median(b), low, high): the percentile bootstrap of the ratio, each side
    resampled within itself. (nan, nan, nan) when a side is empty."""
    a, b = np.asarray(_finite(a)), np.asarray(_finite(b))
    if not len(a) or not len(b):
        return float("nan"), float("nan"), float("nan")
    ratio = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, len(a), size=(resamples, len(a)))], axis=1)
    rb = np.median(b[rng.integers(0, len(b), size=(resamples, len(b)))], axis=1)
    alpha = (1 - level) / 2
    boot = ra / rb
    return ratio, float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))


def repeats_to_separate(a, b) -> int | None:
    """Runs per configuration that would show the observed ratio at ALPHA with 80% power, at the
    observed spread between runs; None where the spread is unknown (a side ran fewer than twice)
    or the medians are equal."""
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2 or min(a + b) <= 0:
        return None
    la, lb = np.log(a), np.log(b)
    effect = abs(float(np.median(la) - np.median(lb)))
    if effect == 0:
        return None
    pooled = math.sqrt(((len(la) - 1) * la.var(ddof=1) + (len(lb) - 1) * lb.var(ddof=1)) / (len(la) + len(lb) - 2))
    n = 2 * (POWER_Z * pooled / effect) ** 2 / RANK_EFFICIENCY
    return max(MIN_REPEATS, math.ceil(n))


@dataclass(frozen=True)
class Comparison:
    """A against B on throughput (higher is faster)."""
    ratio: float             # median(A) / median(B)
    low: float               # its bootstrap interval
    high: float
    p: float                 # one-sided rank-sum p that A is faster (or that B is, when ratio < 1)
    runs: tuple[int, int]
    decided: bool            # p <= ALPHA with MIN_REPEATS runs a side
    needed: int | None       # repeats per configuration that would decide it (undecided pairs)

    def why(self) -> str:
        """What the reader can take from it, in words."""
        n_a, n_b = self.runs
        if min(n_a, n_b) < MIN_REPEATS:
            ran = "one run each" if n_a == n_b == 1 else f"{n_a} and {n_b} runs"
            return (f"{ran}: too few to tell a difference from run-to-run noise "
                    f"(needs {MIN_REPEATS}+ interleaved repeats each)")
        interval = f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}]"
        if self.decided:
            return f"{interval}, rank-sum p={self.p:.3f} over {n_a}+{n_b} interleaved runs"
        if self.needed and self.needed > MAX_USEFUL_REPEATS:
            more = f"; a difference this size would take more than {MAX_USEFUL_REPEATS} repeats each to separate"
        else:
            more = f"; ~{self.needed} repeats each would separate a difference this size" if self.needed else ""
        return f"{interval}, rank-sum p={self.p:.2f} over {n_a}+{n_b} runs: within the noise{more}"


def compare(a, b, seed: int = 0) -> Comparison:
    """A's runs against B's (throughput figures, one per run)."""
    fa, fb = _finite(a), _finite(b)
    ratio, low, high = ratio_interval(fa, fb, seed=seed)
    p = rank_sum_p(fa, fb) if not (ratio < 1) else rank_sum_p(fb, fa)
    enough = min(len(fa), len(fb)) >= MIN_REPEATS
    decided = enough and p <= ALPHA
    return Comparison(ratio, low, high, p, (len(fa), len(fb)), decided,
                      None if decided else repeats_to_separate(fa, fb))
