"""run.step_split: where each measured step's time goes, forward / backward / optimizer.

Stamps are taken on the device's clock at four kinds of point: the step's start and end (the
runner, around train_step), the start and end of the model's forward (hooks on the strategy's
outermost module: once per micro-batch) and the start of the optimizer's step (torch's global
optimizer pre-hook; the last one in the step, the one closest to the update). On a GPU a stamp is
a CUDA event recorded on the current stream, so it marks when the device reached that point, and
the events are read after the window (no sync inside it); on CPU, where kernels run as they are
issued, it is time.perf_counter. Hooks only: every framework whose step calls its model's forward
and a torch optimizer's step() is split alike; a pipeline schedule calls stages, not the model,
and its split says so.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

from ddlbench.metrics.timing import summarize

PHASES = ("forward", "backward", "optimizer", "other")
# which phase the time after a mark belongs to
_AFTER = {"start": "other", "fwd_start": "forward", "fwd_end": "backward", "opt_start": "optimizer"}


def split_step(marks: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Seconds per phase of one step from its marks in time order, (kind, seconds since the step's
    start): kinds start, fwd_start, fwd_end, opt_start, end. The time after a mark belongs to the
    phase that mark opens: forward from a forward's start to its end; backward from a forward's end
    to the next forward or the optimizer (the loss, backward and the gradient reduction the step
    waits for); optimizer from the optimizer's step to the step's end; other: before the first
    forward (the batch's copy to the device). Only the last optimizer mark counts (a wrapper's step
    calling its inner optimizer's fires the hook twice)."""
    if not marks or marks[0][0] != "start" or marks[-1][0] != "end":
        raise ValueError(f"a step's marks run from start to end, got {[k for k, _ in marks]}")
    last_opt = max((i for i, (k, _) in enumerate(marks) if k == "opt_start"), default=None)
    kept = [m for i, m in enumerate(marks) if m[0] != "opt_start" or i == last_opt]
    out = dict.fromkeys(PHASES, 0.0)
    for (kind, t0), (_, t1) in zip(kept, kept[1:]):
        out[_AFTER[kind]] += t1 - t0
    return out


def summarize_split(steps: Sequence[dict[str, float]], clock: str) -> dict:
    """Median seconds per phase over the measured steps, and each phase's share of the summed
    medians."""
    if not steps:
        raise ValueError("no measured steps")
    med = {p: summarize([s[p] for s in steps])["median"] for p in PHASES}
    total = sum(med.values())
    return {"median_s": med, "share": {p: (med[p] / total if total else 0.0) for p in PHASES},
            "steps": len(steps), "clock": clock}


class StepSplit:
    """Hooks and stamps for run.step_split; begin()/end() around each measured train_step."""

    def __init__(self, model, device):
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._cuda = device.type == "cuda"
        self._torch = torch
        self._current: Optional[list] = None
        self._forwards: list[int] = []
        self.steps: list[list] = []
        self._handles = [model.register_forward_pre_hook(lambda *_: self._mark("fwd_start")),
                         model.register_forward_hook(lambda *_: self._mark("fwd_end")),
                         register_optimizer_step_pre_hook(lambda *_: self._mark("opt_start"))]

    @property
    def clock(self) -> str:
        return ("CUDA events on the current stream, read after the window" if self._cuda
                else "time.perf_counter (CPU: kernels run as issued)")

    def _stamp(self):
        if self._cuda:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _mark(self, kind: str) -> None:
        if self._current is not None:
            self._current.append((kind, self._stamp()))

    def begin(self) -> None:
        self._current = [("start", self._stamp())]

    def end(self) -> None:
        self._current.append(("end", self._stamp()))
        self.steps.append(self._current)
        self._current = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def _seconds(self, start, stamp) -> float:
        return start.elapsed_time(stamp) / 1000.0 if self._cuda else stamp - start

    def result(self) -> dict:
        """Per phase, the median over the steps begun and ended (call after the window's sync)."""
        self.close()
        if not self.steps:
            return {"available": False, "reason": "no measured step"}
        forwards = sum(k == "fwd_start" for k, _ in self.steps[0])
        if not forwards:
            return {"available": False, "reason": "no forward of the strategy's model ran inside a step "
                                                  "(pipeline schedules call their stages, not the model)"}
        steps = [split_step([(k, self._seconds(marks[0][1], s)) for k, s in marks]) for marks in self.steps]
        return {"available": True, **summarize_split(steps, self.clock), "forward_calls": forwards}


def gather_split(per_rank: Sequence[Optional[dict]]) -> Optional[dict]:
    """The record's timing.step_split: rank 0's split, each rank's medians beside it."""
    if not per_rank or per_rank[0] is None:
        return None
    return {**per_rank[0], "per_rank_median_s": [r.get("median_s") if r else None for r in per_rank],
            "note": "rank 0's medians per phase; per_rank_median_s for every rank (docs/metrics.md)"}
