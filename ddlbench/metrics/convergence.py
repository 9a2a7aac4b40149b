"""Statistical efficiency: time and epochs to a quality target, and evaluation timestamps.
Pure functions; hand-computed tests in tests/test_convergence.py."""
from __future__ import annotations

from itertools import accumulate
from typing import Optional


def resolve_target(target: Optional[float], metric: str, vs_floor: bool,
                   floor_loss: Optional[float]) -> Optional[float]:
    """The absolute threshold: `target`, or `target` x the dataset's loss floor."""
    if target is None:
        return None
    if vs_floor:
        if floor_loss is None:
            raise ValueError("target_vs_floor needs a dataset with a known loss floor")
        return target * floor_loss
    return target


def reached(value: Optional[float], target: float, metric: str) -> bool:
    if value is None:
        return False
    return value <= target if metric == "loss" else value >= target


def first_reached(evals: list[dict], target: Optional[float], metric: str) -> Optional[dict]:
    """The first evaluation that meets the target (loss <= target, accuracy >= target)."""
    if target is None:
        return None
    for e in evals:
        if reached(e.get(metric), target, metric):
            return e
    return None


def eval_times(step_times: list[float], eval_steps: list[int]) -> list[float]:
    """Training time (sum of global step times, evaluation excluded) after `s` steps, per eval.
    eval_times([1, 2, 3], [0, 2, 3]) == [0, 3, 6]."""
    cum = [0.0, *accumulate(step_times)]
    return [cum[s] for s in eval_steps]
