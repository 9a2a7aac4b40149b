"""When warm-up ends. run.warmup_steps steps at least; with run.warmup_max_steps, warm-up goes on
until the step times have settled, at most that many steps: the median of the last SPAN steps within
TOLERANCE of the median of the SPAN before them (the first step, which builds what later steps
reuse, never counts). Every rank judges its own steps; warm-up ends when all have settled (the
runner agrees over ranks, outside every step), so every rank runs the same steps.

A fixed count cannot know how long a machine takes to settle: on the H200 records of 2026-11-27 the
per-expert loop's first measured steps were still falling (2.08, 1.52, 1.25, 1.17, 0.87 s against a
0.715 s median), and its window mean read 1.20x its median step."""
from __future__ import annotations

import statistics
from typing import Optional

SPAN = 3            # steps per median: one slow step among three moves neither
TOLERANCE = 0.05    # the two medians within 5% of each other


def drift(step_s: list[float], span: int = SPAN) -> Optional[float]:
    """median(last span) / median(the span before) - 1 over step_s (step 0 left out), or None where
    fewer than 2 x span steps follow step 0."""
    steps = step_s[1:]
    if len(steps) < 2 * span:
        return None
    before, last = steps[-2 * span:-span], steps[-span:]
    return statistics.median(last) / statistics.median(before) - 1


def within(d: Optional[float], tolerance: float = TOLERANCE) -> bool:
    """Whether a drift (None: too few steps to judge) is within tolerance."""
    return d is not None and abs(d) <= tolerance


def settled(step_s: list[float], span: int = SPAN, tolerance: float = TOLERANCE) -> bool:
    """Whether the steps so far have settled (drift within tolerance)."""
    return within(drift(step_s, span), tolerance)


def warmup_end(step_s: list[float], min_steps: int, max_steps: Optional[int], span: int = SPAN,
               tolerance: float = TOLERANCE) -> tuple[int, str]:
    """(warm-up steps, why it stopped: 'fixed' | 'settled' | 'cap') for one rank's step times (at
    least max_steps of them), as the runner decides after each warm-up step: after min_steps steps,
    the first count at which they have settled, else max_steps (None: min_steps, 'fixed')."""
    if max_steps is None or max_steps <= min_steps:
        return min_steps, "fixed"
    if len(step_s) < max_steps:
        raise ValueError(f"{len(step_s)} step times cannot say where a warm-up of up to {max_steps} steps ends")
    for n in range(min_steps, max_steps + 1):
        if settled(step_s[:n], span, tolerance):
            return n, "settled"
    return max_steps, "cap"


RULE = (f"warm-up ends at the first step count >= run.warmup_steps at which, on every rank, the median "
        f"of the last {SPAN} steps is within {TOLERANCE:.0%} of the median of the {SPAN} before them "
        "(step 0 left out); at most run.warmup_max_steps")
