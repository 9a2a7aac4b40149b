"""A clean stop on SIGUSR1 (Slurm's time-limit warning: `#SBATCH --signal=B:USR1@120`).

torch elastic does not forward SIGUSR1, so the launcher sends it to the agent's whole process
group itself. Every rank handles it: it writes the series it measured so far (step times,
losses) to <run_dir>/partial/rank<N>.json and exits. The launcher then writes a `timeout`
result from those files: the steps every rank finished, global step time = max over ranks,
warm-up excluded. Nothing is communicated for this (a collective could not be agreed on while
ranks receive the signal at different moments).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from ddlbench.metrics.throughput import throughput
from ddlbench.metrics.timing import global_step_times, mean_ignoring_missing, summarize, window_step_time
from ddlbench.record.results import atomic_write_json
from ddlbench.record.rundir import RunDir

_live: dict = {}     # what the runner is measuring, by reference: step_s, losses, warmup
_stopping = threading.Event()     # set once this process has begun its stop


def stopping() -> bool:
    """Whether this process has begun a SIGUSR1 stop. Its main thread may still be inside a
    collective, which fails as soon as a stopped peer exits: that failure is a consequence of the
    stop and must not be recorded as the run's result."""
    return _stopping.is_set()


def expose(step_s: list, losses: list, warmup: int) -> None:
    """Called by the runner before its loop: the lists it appends to."""
    _live.update(step_s=step_s, losses=losses, warmup=warmup)


def block_stop_signal() -> None:
    """First thing in a rank, before anything starts a thread: SIGUSR1 blocked in this thread and
    so in every thread made after it (threads inherit the mask), for install_rank_handler's."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def install_rank_handler(run_dir: str, rank: int, on_stop=None) -> None:
    """`on_stop()` runs after this rank saved its series (launcher=slurm: rank 0 writes the
    result there, as no launcher process sits above the ranks). The signal is taken by a thread of
    its own (sigtimedwait; block_stop_signal blocked it everywhere else): a Python signal handler runs
    only in the main thread between bytecodes, never while that thread waits inside a collective
    (gloo's C++), where a stopped rank's peers usually are; a SIGUSR1 that came before this call
    stays pending and is taken here. Called from the main thread (the wakeup fd is set there)."""
    once = threading.Lock()

    def stop(signum: int) -> None:
        if not once.acquire(blocking=False):    # the other path got there first: it exits
            return
        _stopping.set()
        step_s = list(_live.get("step_s", []))
        losses = [None if l is None else float(l) for l in _live.get("losses", [])][: len(step_s)]
        atomic_write_json(RunDir(run_dir).rank_partial(rank),
                          {"rank": rank, "signal": signal.Signals(signum).name, "all_step_time_s": step_s,
                           "loss": losses, "warmup": _live.get("warmup", 0)})
        if on_stop is not None:
            on_stop()
        os._exit(128 + signum)

    # A thread made before the mask (`bench run launcher=slurm` is the rank itself: the command line
    # started threads first) may be the one the kernel hands the signal to. Python's handler then runs
    # in the main thread only when it next runs bytecode: never while it sleeps in a hung step or
    # waits in a collective. Its C half writes the signal's number to the wakeup fd at once, from
    # whichever thread took it: the watcher reads that too.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def woken() -> bool:
        try:
            return signal.SIGUSR1 in os.read(wake_r, 256)
        except BlockingIOError:
            return False

    def watch() -> None:
        while True:      # pending for the process (every thread blocks it), or taken by a stray thread
            if signal.sigtimedwait({signal.SIGUSR1}, 0.2) is not None or woken():
                stop(signal.SIGUSR1)
    RunDir(run_dir).partial.mkdir(exist_ok=True)
    signal.signal(signal.SIGUSR1, lambda signum, _frame: stop(signum))
    block_stop_signal()
    threading.Thread(target=watch, name="sigusr1-stop", daemon=True).start()


def wait_until(done, bound_s: float) -> bool:
    """Poll `done()` every 0.2 s for at most `bound_s`; its last answer."""
    deadline = time.monotonic() + bound_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_for_partials(run_dir: Path, world_size: int, bound_s: float = 15.0) -> int:
    """Rank 0 under srun: wait (bounded) until every rank saved its series; how many did."""
    def count() -> int:
        return len(list(RunDir(run_dir).partial.glob("rank*.json")))
    wait_until(lambda: count() >= world_size, bound_s)
    return count()


def partial_timing(run_dir: Path, world_size: int, global_batch: int, tokens_per_sample=None) -> dict | None:
    """Timing and losses of the steps every rank finished before the stop (None if no rank wrote
    its series)."""
    ranks = [json.loads(f.read_text()) for f in sorted(RunDir(run_dir).partial.glob("rank*.json"))]
    if not ranks:
        return None
    steps = min(len(r["all_step_time_s"]) for r in ranks)
    warmup = min(ranks[0]["warmup"], steps)
    series = global_step_times([r["all_step_time_s"][warmup:steps] for r in ranks])
    losses = [mean_ignoring_missing([r["loss"][i] for r in ranks]) for i in range(steps)]
    out = {"ranks_reporting": len(ranks), "world_size": world_size, "steps_completed": steps,
           "warmup_steps": warmup, "measured_steps": len(series),
           "train_loss": [[i, l] for i, l in enumerate(losses)]}
    if series:
        stats = summarize(series)
        out["step_time_s"] = {k: stats[k] for k in ("median", "mean", "p10", "p90", "std", "min", "max")}
        out["series_s"] = series
        out["window_step_s"] = window_step_time([r["all_step_time_s"][warmup:steps] for r in ranks])
        out["throughput"] = throughput(global_batch, out["window_step_s"], world_size, tokens_per_sample)
    return out


class ForwardUsr1:
    """While waiting on a child process: pass SIGUSR1 on to it (its whole process group when it
    leads one), then restore the previous handler."""

    def __init__(self, proc, group: bool):
        self.proc, self.group, self.received = proc, group, False

    def __enter__(self):
        def handler(_signum, _frame):
            self.received = True
            try:
                if self.group:
                    os.killpg(self.proc.pid, signal.SIGUSR1)
                else:
                    self.proc.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                pass
        self.previous = signal.signal(signal.SIGUSR1, handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGUSR1, self.previous)
