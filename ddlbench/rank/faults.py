"""Fault injection for the reliability tests (conf/debug/fault_*.yaml). Off unless configured.

raise: the rank raises at `step`.  kill: the rank SIGKILLs itself at `step`.
hang:  the rank sleeps `seconds` once at `step` (its peers block in the next collective).
sleep: the rank sleeps `seconds` at every step from `step` on (a straggler).
hang_at_start: the rank sleeps `seconds` before it joins the process group, in the local
        launcher's first attempt only (DDLBENCH_LAUNCH_ATTEMPT=1): a rendezvous that never
        completes, which the launcher restarts (run.form_timeout_s).
A fault fires in the first attempt only: ranks the elastic agent restarts (launcher.max_restarts)
run on past it, as a job recovers from a failure that does not recur.
jitter: from `step` on, the rank sleeps a random 0..`seconds` at the END of every step, after
        the step's collectives (host hiccups: GC, logging, a slow loader), so step boundaries
        drift between ranks (tests/test_runs.py: the throughput estimator is unbiased under it).
"""
from __future__ import annotations

import os
import random
import signal
import time


class InjectedFault(RuntimeError):
    pass


def before_process_group(fault_cfg, rank: int) -> None:
    if fault_cfg.kind == "hang_at_start" and fault_cfg.rank == rank \
            and os.environ.get("DDLBENCH_LAUNCH_ATTEMPT", "1") == "1":
        time.sleep(fault_cfg.seconds)


class FaultInjector:
    def __init__(self, fault_cfg, rank: int, run_dir=None):
        from ddlbench.lifecycle import events
        self.kind = fault_cfg.kind if fault_cfg.rank == rank and not events.attempt() else "none"
        self.step, self.rank = fault_cfg.step, rank
        self.seconds = fault_cfg.seconds
        self.run_dir = run_dir
        self._random = random.Random(rank)

    def _mark(self, step: int) -> None:
        """<run_dir>/fault_fired: when the fault fired (benchmarks/fault_matrix.py times detection); on
        the timeline too, with the step (the record's recovery counts the steps a restart lost from it)."""
        if self.run_dir is not None:
            from ddlbench.lifecycle import events
            now = time.time()
            with open(os.path.join(self.run_dir, "fault_fired"), "w") as f:
                f.write(f"{now:.6f}\n")
            events.mark(self.run_dir, "fault", self.rank, t=now, step=step, kind=self.kind)

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def after_step(self, step: int) -> None:
        if self.kind == "jitter" and step >= self.step:
            time.sleep(self._random.uniform(0.0, self.seconds))

    def at_step(self, step: int) -> None:
        if self.kind == "sleep" and step >= self.step:
            time.sleep(self.seconds)
        if step != self.step:
            return
        self._mark(step)
        if self.kind == "raise":
            raise InjectedFault(f"injected fault at step {step}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            time.sleep(self.seconds)
