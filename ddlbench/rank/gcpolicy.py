"""What Python's cyclic garbage collector may do inside the timed loop (`run.gc`).

A full (generation 2) collection walks every object the process tracks. A rank that has imported
torch and transformers and built a model holds ~470,000 of them, whatever the model's width, and
one full collection takes ~0.2 s: 0.19-0.25 s for each full collection inside FSDP2 windows on an
H200's host (reports/gpu-h200/2026-11-27/, steps C and CA: `timing.host_events`; 89-102% of its
window's slowest step's excess over the median step), 0.23 s for llama_1b's rank on this project's 2-core VM
(benchmarks/gc_pause.py). FSDP2, and more so gradient accumulation, allocate enough container
objects per step on CUDA (29-74 young collections in 20 steps) that the interpreter's thresholds
start a full collection every few dozen steps: one step in a window ~0.2 s slower than the rest,
at a step that depends on the process's history, not on the framework.

Policies (the same for every framework; recorded as `timing.host_events.gc_policy`):
- `freeze` (default): before the loop a full collection, then `gc.freeze()` moves every object
  set-up made into the permanent generation, which collections skip; again after the first step
  (the optimizer's state exists then). Automatic collection stays on, so cycles the loop makes are
  still collected, and a full collection walks only what the loop keeps (0.00 ms measured after
  freezing the 474,000 objects above). Both collections are outside every step.
- `python`: the interpreter's own thresholds, untouched: what a plain training loop gets.
- `torchtitan`: torchtitan's `GarbageCollection`: automatic collection off, one generation-1
  collection before the loop and one every `run.gc_every` steps (torchtitan's `gc_freq`, default
  50) at the start of the step, timed with it.
After the loop automatic collection is restored and frozen objects are unfrozen.

A rank forked on CPU starts with its launcher's objects already frozen (ddlbench/launch/forked.py:
a collection in a forked child walked them all and copied every page they sit on). `freeze` keeps
them so (`inherited_frozen_objects`: the agent's count); `python` and `torchtitan` unfreeze them
before the loop, so their collections walk what a rank started as a fresh interpreter would. The
frozen counts are that inherited count plus the objects the rank freezes itself, counted while
they are still tracked (`gc.get_freeze_count()` walks every frozen object: ~0.25 s a call).
"""
from __future__ import annotations

import gc
import time

INHERITED_FROZEN_ENV = "DDLBENCH_INHERITED_FROZEN"   # how many objects a forked rank starts with frozen (its agent's count)

POLICIES = ("freeze", "python", "torchtitan")


class GcPolicy:
    def __init__(self, name: str = "freeze", every: int = 50):
        if name not in POLICIES:
            raise ValueError(f"run.gc={name!r}: one of {', '.join(POLICIES)}")
        self.name, self.every = name, every
        self.record: dict = {"policy": name}
        self._was_enabled = gc.isenabled()
        self._inherited = inherited_frozen()

    def before_loop(self) -> None:
        """Outside every step: the collection (and freeze) the policy starts from."""
        t0 = time.perf_counter()
        self.record["inherited_frozen_objects"] = self._inherited
        if self.name != "freeze":
            gc.unfreeze()       # what a forked rank inherited frozen: as in a fresh interpreter (module docstring)
            self._inherited = 0
        if self.name == "freeze":
            self.record["frozen_objects_before_loop"] = self._inherited + _freeze_what_survives()
        elif self.name == "torchtitan":
            gc.disable()
            gc.collect(1)
            self.record["every"] = self.every
        self.record["before_loop_s"] = time.perf_counter() - t0

    def after_first_step(self) -> None:
        """Outside every step, after step 0: what that step made to stay (optimizer state) frozen too."""
        if self.name == "freeze":
            t0 = time.perf_counter()
            self.record["frozen_objects"] = self.record["frozen_objects_before_loop"] + _freeze_what_survives()
            self.record["after_first_step_s"] = time.perf_counter() - t0

    def in_step(self, step: int) -> bool:
        """At the start of `step`, inside its time: torchtitan's periodic collection. True if one ran."""
        if self.name == "torchtitan" and step > 1 and step % self.every == 0:
            gc.collect(1)
            return True
        return False

    def after_loop(self) -> dict:
        """Automatic collection as it was before the loop, nothing frozen but what the rank inherited
        frozen (unfreezing it would have the next full collection walk and copy it); what the policy did."""
        if self.name == "freeze" and not self._inherited:
            gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        return self.record


def inherited_frozen() -> int:
    """The objects this rank inherited frozen from the agent that forked it (0: none, or spawned;
    ddlbench/launch/forked.py: freeze_for_forked_ranks)."""
    import os
    return int(os.environ.get(INHERITED_FROZEN_ENV) or 0)


def _freeze_what_survives() -> int:
    """A full collection, then what survived (every object still tracked) frozen: how many."""
    gc.collect()
    kept = len(gc.get_objects())
    gc.freeze()
    return kept
