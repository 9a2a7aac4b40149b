"""Statistical-efficiency arithmetic and repeat statistics, hand-computed."""
import math

import pytest

from ddlbench.metrics.convergence import eval_times, first_reached, reached, resolve_target
from ddlbench.metrics.stats import bootstrap_median_ci, repeat_range


def test_eval_times_sum_step_times_before_each_evaluation():
    assert eval_times([1.0, 2.0, 3.0], [0, 2, 3]) == [0.0, 3.0, 6.0]


def test_target_resolution():
    assert resolve_target(None, "loss", False, 1.8) is None
    assert resolve_target(2.0, "loss", False, 1.8) == 2.0
    assert resolve_target(1.25, "loss", True, 1.8) == pytest.approx(2.25)
    with pytest.raises(ValueError):
        resolve_target(1.1, "loss", True, None)


def test_first_reached_loss_and_accuracy():
    evals = [{"step": 0, "loss": 5.0, "accuracy": 0.1, "time_s": 0.0, "epoch": 0.0},
             {"step": 8, "loss": 2.5, "accuracy": 0.6, "time_s": 4.0, "epoch": 0.5},
             {"step": 16, "loss": 2.0, "accuracy": 0.9, "time_s": 8.0, "epoch": 1.0}]
    assert first_reached(evals, 2.5, "loss")["time_s"] == 4.0     # <= counts
    assert first_reached(evals, 0.85, "accuracy")["epoch"] == 1.0
    assert first_reached(evals, 1.0, "loss") is None
    assert first_reached(evals, None, "loss") is None
    assert not reached(None, 1.0, "loss")


def test_bootstrap_median_ci():
    med, lo, hi = bootstrap_median_ci([10.0])
    assert med == 10.0 and math.isnan(lo) and math.isnan(hi)   # one run: no interval
    # 2 to 4 repeats: no interval is claimed (the bootstrap would give about [min, max]); the
    # report shows the range, labelled as one
    med, lo, hi = bootstrap_median_ci([1.0, 4.0, 2.0, 3.0])
    assert med == 2.5 and math.isnan(lo) and math.isnan(hi)
    assert repeat_range([1.0, 4.0, None, 2.0]) == (1.0, 4.0, 3)
    med, lo, hi = bootstrap_median_ci([1, 2, 3, 4, 5])
    assert med == 3.0 and 1 <= lo <= 3 <= hi <= 5
    assert bootstrap_median_ci([1, 2, 3, 4, 5]) == (med, lo, hi)   # seeded: reproducible
    assert bootstrap_median_ci([7.0] * 5) == (7.0, 7.0, 7.0)
    assert math.isnan(bootstrap_median_ci([])[0])
