"""How long the measured window is. run.measure_steps steps, or with run.min_window_s at least that
many seconds of steps: as many as fill it at the pace of the last warm-up step, the slowest rank's
(agreed over ranks once, after the warm-up and outside the window, so every rank runs the same
steps). A long window is what keeps one outlier from moving the figure: a step slower than the
median by x seconds moves the window's mean by x / window seconds (timing.window_vs_median keeps
that share for the slowest step)."""
from __future__ import annotations

import math
from typing import Optional

MAX_STEPS = 1_000_000   # a bound on a window sized from a near-zero warm-up step


def window_steps(measure_steps: int, min_window_s: Optional[float], warm_step_s: Optional[float]) -> int:
    """Measured steps: measure_steps, or the steps that fill min_window_s at warm_step_s a step,
    whichever is more (never more than MAX_STEPS)."""
    if min_window_s is None:
        return measure_steps
    if warm_step_s is None or warm_step_s <= 0:
        raise ValueError(f"a window sized by time needs a positive warm-up step time, got {warm_step_s}")
    return min(max(measure_steps, math.ceil(min_window_s / warm_step_s - 1e-9)), MAX_STEPS)


def seconds_for_outlier(excess_s: float, moves: float = 0.01) -> float:
    """The window length (seconds) in which one step excess_s slower than the median moves the
    window's mean step by at most `moves` (a fraction): excess_s / moves."""
    if excess_s < 0 or not 0 < moves < 1:
        raise ValueError("excess_s >= 0 and 0 < moves < 1")
    return excess_s / moves
