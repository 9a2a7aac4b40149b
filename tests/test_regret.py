"""The regret arithmetic (ddlbench/advise/regret.py) by hand and on a published exhaustive log:
AMP's 53 configurations of GPT-2 on 16 GPUs (tests/data/amp_het_cluster_gpt2.csv)."""
import csv
import math
from pathlib import Path

import pytest

from ddlbench.advise.regret import bootstrap_interval, evaluate, kendall_tau_b, ranked, regret_at
from ddlbench.metrics.stats import spearman

AMP = Path(__file__).parent / "data" / "amp_het_cluster_gpt2.csv"


def amp_log():
    rows = list(csv.DictReader(line for line in AMP.read_text().splitlines() if not line.startswith("#")))
    return [float(r["predicted"]) for r in rows], [float(r["measured"]) for r in rows]


def test_regret_on_amps_published_exhaustive_log():
    predicted, measured = amp_log()
    assert len(predicted) == 53 and sum(math.isinf(m) for m in measured) == 10
    # its first pick ran 1.47 s, the best of the grid 1.28 s - its second pick
    assert regret_at(predicted, measured, 1) == pytest.approx(1.47 / 1.28) == pytest.approx(1.148, abs=5e-4)
    assert regret_at(predicted, measured, 2) == 1.0
    ev = evaluate(predicted, measured, budget=13)
    assert ev["best_in_top"] == {"1": False, "3": True, "5": True, "13": True}
    assert ev["infeasible_in_top"]["13"] == 1          # the 11th prediction failed
    assert ev["spread"] == pytest.approx(3.92 / 1.28) and not ev["trivial"]
    # its ranking of the feasible candidates: the published Spearman 0.39; tau-b weaker, interval excludes 0
    ok = [(p, m) for p, m in zip(predicted, measured) if math.isfinite(m)]
    assert spearman([p for p, _ in ok], [m for _, m in ok]) == pytest.approx(0.39, abs=0.005)
    lo, hi = ev["kendall_tau_b_interval"]
    assert lo < ev["kendall_tau_b"] < hi and lo > 0


def test_regret_by_hand():
    predicted = [1.0, 2.0, 3.0, 4.0]
    measured = [math.inf, 12.0, 10.0, 11.0]
    assert ranked(predicted, measured) == [math.inf, 12.0, 10.0, 11.0]
    assert regret_at(predicted, measured, 1) == math.inf        # the first pick failed
    assert regret_at(predicted, measured, 2) == pytest.approx(1.2)
    assert regret_at(predicted, measured, 3) == 1.0
    ev = evaluate(predicted, measured, ks=(1,), budget=2)
    assert ev["regret"] == {"1": math.inf, "2": pytest.approx(1.2)} and ev["infeasible_in_top"] == {"1": 1, "2": 1}
    assert ev["spread"] == pytest.approx(1.2) and ev["feasible"] == 3
    assert evaluate([1, 2], [10.0, 10.3])["trivial"]             # within 5%: any pick is good
    with pytest.raises(ValueError, match="no candidate ran"):
        regret_at([1, 2], [math.inf, None], 1)


def test_kendall_tau_b_by_hand():
    assert kendall_tau_b([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    # pairs: (1,2) concordant, (1,3) concordant, (2,3) tied in y: (2 - 0) / sqrt(3 x 2)
    assert kendall_tau_b([1, 2, 3], [1, 2, 2]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    assert bootstrap_interval([1, 2], [1, 2]) is None
    a = bootstrap_interval([1, 2, 3, 4, 5], [1, 3, 2, 5, 4], seed=1)
    assert a == bootstrap_interval([1, 2, 3, 4, 5], [1, 3, 2, 5, 4], seed=1) and -1 <= a[0] <= a[1] <= 1
