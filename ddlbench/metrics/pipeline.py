"""Pipeline bubble arithmetic (pure functions, hand-checked in tests/test_metrics.py)."""
from __future__ import annotations

from typing import Optional


def analytic_bubble(schedule: str, p: int, m: int, v: int = 1) -> Optional[float]:
    """Idle fraction of a pipeline step with equal stage times: GPipe and 1F1B
    (p-1)/(m+p-1) (GPipe paper; PipeDream-Flush has the same bubble, less memory);
    interleaved 1F1B with v stages per rank (p-1)/(v*m+p-1) (Narayanan et al. 2021).
    Zero-bubble schedules have no closed form here (it depends on the F/B/W time split): None."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"p, m, v must be >= 1 (got {p}, {m}, {v})")
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1)
    return None


def measured_idle(step_time_s: float, busy_s: float):
    """Idle fraction of one rank: 1 - busy / step time. None when the busy estimate exceeds the
    step (the estimate is wrong there: clamping it to 0 would report a perfect pipeline)."""
    if step_time_s <= 0:
        raise ValueError("step time must be positive")
    if busy_s > step_time_s:
        return None
    return 1.0 - busy_s / step_time_s
