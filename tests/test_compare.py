"""The verdict's statistics (ddlbench/metrics/compare.py), against values worked by hand."""
import math

import numpy as np
import pytest

from ddlbench.metrics.compare import ALPHA, compare, rank_sum_p, ratio_interval, repeats_to_separate


def test_rank_sum_p_counts_the_splits_of_the_pooled_runs():
    # 3 against 3, every run of A above every run of B: 1 split of C(6,3) = 20 has A's rank sum
    assert rank_sum_p([3, 4, 5], [1, 2, 2.5]) == pytest.approx(1 / 20)
    assert rank_sum_p([1, 2, 3], [4, 5, 6]) == 1.0
    # 4 against 4, one of B's runs above one of A's: ranks of A 4,6,7,8 (sum 25); sums >= 25 are
    # {5,6,7,8} and {4,6,7,8}: 2 of C(8,4) = 70
    assert rank_sum_p([10, 11, 12, 13], [1, 2, 3, 10.5]) == pytest.approx(2 / 70)
    # ties take mid-ranks: pooled 1,1,2,2 -> doubled ranks 3,3,7,7; A = {1,2} sums 10; the six
    # pairs sum 6 (1), 10 (4), 14 (1): 5 of 6 reach 10
    assert rank_sum_p([1, 2], [1, 2]) == pytest.approx(5 / 6)
    assert rank_sum_p([], [1.0]) == 1.0 and rank_sum_p([2.0, None, float("nan")], [1.0]) == pytest.approx(1 / 2)


def test_a_winner_needs_three_interleaved_runs_a_side_all_above():
    faster = compare([105, 106, 104], [100, 101, 99])
    assert faster.decided and faster.p == pytest.approx(0.05) and faster.ratio == pytest.approx(105 / 100)
    assert faster.low > 1 and "p=0.050 over 3+3 interleaved runs" in faster.why()
    # the same values, the other way round: B is the faster one, decided the same
    slower = compare([100, 101, 99], [105, 106, 104])
    assert slower.decided and slower.ratio < 1 and slower.p == pytest.approx(0.05)
    # one overlap in three: p = 2/20 > ALPHA, within the noise, and what would separate it is said
    close = compare([105, 106, 100.5], [100, 101, 99])
    assert not close.decided and close.p == pytest.approx(2 / 20) and close.p > ALPHA
    assert "within the noise" in close.why() and close.needed is not None
    # a 1% difference at a 5% spread: said to be too small to chase, not "~1596 repeats"
    tiny = compare([101, 96, 106], [100, 95, 105])
    assert not tiny.decided and tiny.needed > 100 and "would take more than 100 repeats each" in tiny.why()
    # two runs a side never decide, however far apart
    two = compare([200, 210], [100, 101])
    assert not two.decided and "2 and 2 runs" in two.why()
    one = compare([200], [100])
    assert not one.decided and one.why().startswith("one run each") and one.needed is None


def test_repeats_to_separate_follow_the_spread_between_runs():
    # log throughputs 0.2, 0.1, 0.0 against 0.1, 0.0, -0.1: effect 0.1, pooled sd 0.1;
    # n = 2 (z_0.95 + z_0.8)^2 (sd / effect)^2 / (3 / pi) = 2 x 2.4865^2 / 0.95493 = 12.95 -> 13
    a, b = np.exp([0.2, 0.1, 0.0]), np.exp([0.1, 0.0, -0.1])
    assert repeats_to_separate(a, b) == 13
    # ten times less spread: 0.13 repeats, never fewer than the test's minimum of 3
    a, b = np.exp([0.11, 0.10, 0.09]), np.exp([0.01, 0.0, -0.01])
    assert repeats_to_separate(a, b) == 3
    assert repeats_to_separate([1.0], [2.0, 3.0]) is None and repeats_to_separate([2.0, 2.0], [2.0, 2.0]) is None


def test_ratio_interval_is_seeded_and_brackets_the_ratio():
    a, b = [105, 106, 104, 107, 103], [100, 101, 99, 102, 98]
    first, again = ratio_interval(a, b), ratio_interval(a, b)
    assert first == again and first[0] == pytest.approx(1.05)
    assert first[1] <= first[0] <= first[2] and first[1] > 1
    assert all(math.isnan(x) for x in ratio_interval([], b))


def test_draws_from_one_distribution_are_rarely_called_apart():
    """Repeats drawn from one distribution: the rule calls a pair apart in about ALPHA x 2 of
    the draws (either direction), never more than the test allows; drawn 5% apart with a 1%
    spread, it separates them at 5 runs each almost always."""
    rng = np.random.default_rng(7)
    same = [compare(rng.normal(100, 3, 5), rng.normal(100, 3, 5)).decided for _ in range(400)]
    assert np.mean(same) <= 2 * ALPHA + 0.03
    apart = [compare(rng.normal(105, 1, 5), rng.normal(100, 1, 5)).decided for _ in range(100)]
    assert np.mean(apart) >= 0.95
