"""Pipeline bubble and schedule arithmetic (pure functions, hand-checked in tests/test_metrics.py and
tests/test_schedule.py)."""
from __future__ import annotations

from typing import Optional


def interleaved_order(rank: int, pp: int, v: int, m: int) -> list[tuple[str, int, int]]:
    """Rank `rank`'s compute under torch's ScheduleInterleaved1F1B, in its order: ('F' or 'B', stage,
    micro-batch), stage k on rank k mod pp (torch.distributed.pipelining.schedules: _get_warmup_ops
    and _get_1f1b_rank_ops without their no-op padding, which only aligns the ranks' lists; tested
    against torch's own). Micro-batches go in rounds of m // max(1, m // pp), which must divide m;
    a rank runs `warmup` forwards (its later stages' first round, two more per hop from the last
    rank), then a forward and a backward in turn, then the backwards left; a round's forwards go to
    one stage, then the next (depth first), and the backwards come back the other way."""
    rounds = max(1, m // pp)
    if m % rounds:
        raise ValueError(f"interleaved 1F1B: {m} micro-batches are not a multiple of its {rounds} rounds")
    per_round, total = m // rounds, m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)
    steady = total - warmup
    ops, nf, nb = [], [0] * (pp * v), [0] * (pp * v)

    def op(kind: str, stage: int, seen: list[int]) -> None:
        ops.append((kind, stage, seen[stage]))
        seen[stage] += 1

    for i in range(warmup + steady + warmup):
        if i < warmup + steady:
            op("F", (i // per_round) % v * pp + rank, nf)
        if i >= warmup:
            op("B", (v - 1 - ((i - warmup) // per_round) % v) * pp + rank, nb)
    return ops


def interleaved_in_flight(rank: int, pp: int, v: int, m: int) -> float:
    """The most micro-batches' activations `rank` holds at once under interleaved 1F1B, in whole
    micro-batches of the rank (each of its v stages holds 1/v of its layers): the peak of forwards
    done minus backwards done along `interleaved_order`, over v. Rank 0 of pp 8, v 2 at 8+
    micro-batches: (8 + 2 x 7 + 1) / 2 = 11.5 (1F1B's stage 0: 8)."""
    held = peak = 0
    for kind, _, _ in interleaved_order(rank, pp, v, m):
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak / v

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
