"""Host events inside the timed loop that cost a step a fixed amount whatever its work: Python's
cyclic garbage collector (each collection's generation and seconds, from `gc.callbacks`) and, on
CUDA, the caching allocator's retries (`num_alloc_retries`: a cudaMalloc failed, so the allocator
synchronised, freed every cached block and tried again). Both are recorded so that a slow step in a
window can be told from the training step's own work; the collector's policy in the loop is
`run.gc` (ddlbench/rank/gcpolicy.py: set-up's objects frozen by default, which is what made full
collections cheap after these records found them in FSDP2's windows on an H200).

The callback is the only thing this adds inside a step: a perf_counter read and a list append per
collection. The allocator's counter is read before and after the loop (reading it inside would put
host work in a step), so its count covers the warm-up too.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

# a collection at least this long is listed with its step; shorter ones are only counted
LISTED_S = 0.001


@dataclass
class GcClock:
    """Every collection of the cyclic GC while started: (perf_counter at its start, generation, seconds)."""
    events: list[tuple[float, int, float]] = field(default_factory=list)
    _began: float = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.events.append((self._began, int(info["generation"]), time.perf_counter() - self._began))

    def start(self) -> "GcClock":
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> list[tuple[float, int, float]]:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        return self.events


def alloc_retries(device) -> int | None:
    """The CUDA caching allocator's retry count so far on `device` (None off CUDA)."""
    if getattr(device, "type", device) != "cuda":
        return None
    import torch
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def step_of(t: float, start: float, step_s: list[float]) -> int | None:
    """Which measured step (0-based) the instant `t` falls in: the window's steps are contiguous from
    `start` (each step's end is the next one's start); None outside the window."""
    if t < start:
        return None
    end = start
    for i, s in enumerate(step_s):
        end += s
        if t < end:
            return i
    return None


def summary(events: list[tuple[float, int, float]], start: float | None, step_s: list[float],
            retries: int | None) -> dict:
    """This rank's host events in its measured window: GC collections per generation, their
    seconds in all and per step, each one of at least LISTED_S with its step; the allocator's
    retries over the loop."""
    gc_s = [0.0] * (len(step_s) if start is not None else 0)     # no window (epochs): nothing placed
    counts = {0: 0, 1: 0, 2: 0}
    listed = []
    for t, gen, secs in events:
        i = step_of(t, start, step_s) if start is not None else None
        if i is None:
            continue
        counts[gen] = counts.get(gen, 0) + 1
        gc_s[i] += secs
        if secs >= LISTED_S:
            listed.append({"step": i, "generation": gen, "s": secs})
    return {"gc": {"collections": {str(k): v for k, v in counts.items()}, "seconds": sum(gc_s),
                   "per_step_s": gc_s, "listed": listed},
            "cuda_alloc_retries_in_loop": retries}


def slowest_step(step_times: list[float], median: float, per_rank: list[dict | None]) -> dict | None:
    """The window's slowest step (max over ranks), how much over the median it is, and the GC
    seconds the rank with the most of them spent in it; `gc_explains` when they are at least half
    the excess."""
    if not step_times or not all(per_rank):
        return None
    i = max(range(len(step_times)), key=step_times.__getitem__)
    excess = step_times[i] - median
    in_step = max(r["gc"]["per_step_s"][i] if i < len(r["gc"]["per_step_s"]) else 0.0 for r in per_rank)
    return {"measured_step": i, "step_s": step_times[i], "over_median_s": excess, "gc_s": in_step,
            "gc_explains": excess > 0 and in_step >= excess / 2,
            "rule": "gc_explains when the garbage collector's seconds in the slowest step are at least "
                    "half of that step's excess over the median step"}
