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


def pipeline_summary(schedule: str, pp: int, v: int, m: int, stats: list[dict], per_rank_median_s: list[float]) -> dict:
    """result.json's pipeline section: each rank's measured idle fraction (from its busy time a step,
    where the probe could time it) beside the schedule's analytic bubble."""
    for st, median in zip(stats, per_rank_median_s):
        busy = st.get("busy_s_per_step")
        st["idle_fraction_measured"] = None if busy is None else measured_idle(median, busy)
    measured = [s["idle_fraction_measured"] for s in stats if s["idle_fraction_measured"] is not None]
    return {
        "kind": "pipeline", "schedule": schedule, "pp": pp, "stages_per_rank": v, "n_microbatches": m,
        "bubble_fraction_analytic": analytic_bubble(schedule, pp, m, v),
        "idle_fraction_measured_mean": sum(measured) / len(measured) if measured else None,
        "per_rank": stats,
        "note": "analytic: (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), none for zero-bubble; "
                "measured: 1 - busy/step time per rank, busy = m x (fastest forward+backward of the rank's stages on one "
                "micro-batch, timed alone after the window, untimed by the runner; none with tp > 1 or FSDP2 inside "
                "the stages, whose stages communicate inside forward/backward; none where that estimate exceeds the step)",
    }
