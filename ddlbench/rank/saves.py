"""run.checkpoint on a rank: every `every` measured steps the loop stops between two steps (like an
evaluation: no step's time holds it) and the strategy's saver (ddlbench/adapters/checkpoint.py)
saves; an async save's write goes on while the next steps run, and those steps' slowdown is
measured against the window's median step. At the end every save is waited for (never abandoned),
its bytes counted, and a plain write of as many bytes to the same directory timed beside it.

Once a save is durable on every rank, rank 0 writes `COMPLETE` into its directory (after a sync save
returns, or from an async save's done callback: DCP's coordinator, DeepSpeed's closing barrier and a
rank-0 save each make rank 0 the last to finish). A rank the elastic agent restarted
(launcher.max_restarts) resumes from the newest save that has one; a save cut short by the failure is
passed over."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from ddlbench.adapters.checkpoint import fsync_dir
from ddlbench.lifecycle import events
from ddlbench.metrics.checkpoint import persist_slowdown, rate
from ddlbench.record.rundir import RunDir

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"step_(\d+)")     # a save's directory: step_<steps trained>


class RestoreError(RuntimeError):
    """run.checkpoint.resume_from could not be loaded: the path and the cause (a run that fails, never
    one that trains on from a half-loaded state)."""


def _failures() -> tuple:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name
    return (Exception, CheckpointException)


FAILURES = _failures()


def cause(exc: BaseException) -> str:
    """One line for what went wrong: DCP's CheckpointException holds every rank's own error (the first
    is said, with its rank); anything else its type and message."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (inner, _) = next(iter(sorted(failures.items())))
        return f"{type(inner).__name__} on rank {rank}: {str(inner)[:600]}"
    text = str(exc)
    if not text and exc.__traceback__ is not None:    # a bare assert (DeepSpeed's): where, and what it asserted
        import traceback
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"at {'/'.join(Path(frame.filename).parts[-3:])}:{frame.lineno}: {frame.line}"
    return f"{type(exc).__name__}: {text[:600]}"


def resumed_step(path: str) -> int:
    """N of a save's directory `.../step_<N>`: the steps its state has trained."""
    m = STEP_DIR.fullmatch(Path(path).name)
    if not m:
        raise RestoreError(f"run.checkpoint.resume_from={path}: not a save's directory (its name is step_<N>, "
                           "as run.checkpoint writes them)")
    return int(m.group(1))


def newest_complete(root: Path) -> Path | None:
    """The save under `root` with the most steps whose COMPLETE marker rank 0 wrote; None if none."""
    found = [(int(m.group(1)), p) for p in root.glob("step_*")
             if (m := STEP_DIR.fullmatch(p.name)) and (p / COMPLETE).is_file()]
    return max(found)[1] if found else None


class Saves:
    def __init__(self, cfg, strategy, run_dir: Path, rank: int):
        import torch.distributed as dist
        ck = cfg.run.checkpoint
        self.every, self.mode, self.keep, self.rank, self.run_dir = ck.every, ck.mode, ck.keep, rank, run_dir
        self.root = Path(ck.dir) if ck.dir else RunDir(run_dir).checkpoints
        # a save's collectives (DCP's plans, its barrier) on a gloo group of their own: an async
        # save's thread never interleaves them with training's on the default group
        self.group = dist.new_group(backend="gloo")
        self.saver = strategy.checkpoint_saver(self.group)
        self.saves: list = []
        self.steps: list[tuple[float, float]] = []    # (end, duration) of each measured step
        self.wait_s = 0.0
        self.restored: dict | None = None
        self.start = 0               # steps the state had trained before this run (resume_from)
        self.inherited: list[Path] = []   # the failed attempt's save a restart resumed from

    def resume(self, path: str | None) -> int:
        """The step the run starts from: run.checkpoint.resume_from's; in an attempt the elastic agent
        restarted, the newest complete save's (none yet: 0, afresh)."""
        if events.attempt():
            newest = newest_complete(self.root)
            path = str(newest) if newest is not None else path
            self.inherited = [newest] if newest is not None else []   # pruned as this attempt's own saves land
        return self.restore(path) if path else 0

    def restore(self, path: str) -> int:
        """The save at `path` loaded into the strategy, by phase; the step the run goes on from."""
        step = resumed_step(path)
        if not Path(path).is_dir():
            raise RestoreError(f"run.checkpoint.resume_from={path}: no such directory")
        t0 = t = time.perf_counter()
        phases = {}
        try:
            for phase in self.saver.load(Path(path)):     # each phase's name as it ends
                now = time.perf_counter()
                phases[phase], t = now - t, now
        except FAILURES as exc:     # torn, partial, another model's or layout's: the run fails, saying why
            raise RestoreError(f"run.checkpoint.resume_from={path}: {cause(exc)}") from None
        self.restored = {"path": str(path), "step": step, "load_s": time.perf_counter() - t0, **phases}
        self.start = step
        events.mark(self.run_dir, "restored", self.rank, step=step)
        return step

    def due(self, step: int, warmup: int) -> bool:
        """After measured step `step` (0-based over the run): every `every` measured steps."""
        return self.every > 0 and step >= warmup and (step - warmup + 1) % self.every == 0

    def after_step(self, step: int, warmup: int, end: float, duration: float) -> None:
        if step >= warmup:
            self.steps.append((end, duration))

    def save(self, step: int) -> None:
        """One save; an async save still being written is waited for first (as torchtitan does: two
        saves in flight would interleave their collectives on the saves' group), in the blocked time."""
        path = self.root / f"step_{self.start + step + 1}"      # steps trained in all, a resumed run's before it too
        t0 = time.perf_counter()
        for s in self.saves:
            if not s.durable():
                self._wait(s)
        waited = time.perf_counter() - t0
        try:       # every rank calls the saver (its collectives), which makes the directory
            save = self.saver.save(path, self.mode)
        except FAILURES as exc:    # a full disk, an unwritable directory: the save fails, the run goes on
            from ddlbench.adapters.checkpoint import Save
            save = Save(str(path), error=cause(exc))
        returned = time.perf_counter()
        # the call's times, from its start (the wait included): blocked until it returned; a sync save
        # durable then, an async one when its future completes (after the saver's own callback)
        save.began, save.blocked_s = t0, returned - t0
        save.extra.update(step=self.start + step + 1, waited_for_previous_s=waited, returned=returned)
        if save.future is None:
            save.done = None if save.error else returned
            self._complete(save)
        else:
            save.future.add_done_callback(lambda f, s=save: self._durable(s, f))
        self.saves.append(save)
        self._prune()

    def _durable(self, save, future) -> None:
        """An async save's done callback: durable now; marked complete before anyone waiting sees it done."""
        now = time.perf_counter()
        if future.exception() is None:
            self._complete(save)
        save.done = now

    def _complete(self, save) -> None:
        """Rank 0, once `save` is durable on every rank: its files counted, its COMPLETE marker written
        (a restart resumes from it)."""
        if self.rank == 0 and save.error is None:
            save.extra["files"] = sum(1 for p in Path(save.path).rglob("*") if p.is_file())
            marker = Path(save.path) / COMPLETE
            try:
                marker.write_text(f"step {save.extra['step']}\n")
                fsync_dir(marker.parent)
            except OSError as exc:     # written, but a restart would not know it whole: the save's error
                save.error = f"its {COMPLETE} marker could not be written: {type(exc).__name__}: {exc}"

    def _prune(self) -> None:
        """The newest `keep` saves stay; an older one goes once it is durable (rank 0 removes it)."""
        if self.rank != 0:
            return
        for old in self.saves[:-self.keep]:
            if old.durable() and Path(old.path).exists() and not old.extra.get("removed"):
                shutil.rmtree(old.path, ignore_errors=True)
                old.extra["removed"] = True
        if self.inherited and sum(s.done is not None and s.error is None for s in self.saves) >= self.keep:
            for path in self.inherited:
                shutil.rmtree(path, ignore_errors=True)
            self.inherited = []

    def finish(self) -> None:
        """Every save waited for, after the loop (its time recorded as wait_s)."""
        t0 = time.perf_counter()
        for s in self.saves:
            self._wait(s)
        if hasattr(self.saver, "close"):
            self.saver.close()
        self.wait_s = time.perf_counter() - t0

    @staticmethod
    def _wait(s) -> None:
        """An async save waited for until durable (or failed: its error kept)."""
        if s.future is None:
            return
        try:
            s.future.result()
        except FAILURES as exc:   # recorded, the run goes on
            s.error = s.error or cause(exc)
        while s.done is None:      # the callbacks run right after result() returns, ours last
            time.sleep(0.001)

    def rows(self, baseline: float) -> list[dict]:
        """This rank's row per save (before any is pruned again): {step, blocked_s, durable_s, bytes, slowdown}."""
        out = []
        for s in self.saves:
            end = None if s.done is None or s.error else max(s.done, s.extra["returned"])
            out.append({"step": s.extra["step"], "blocked_s": s.blocked_s, "waited_s": s.extra["waited_for_previous_s"],
                        "files": s.extra.get("files"), "pinned_bytes": s.extra.get("pinned_bytes", 0),
                        "durable_s": None if end is None else end - s.began, "bytes": s.nbytes, "error": s.error,
                        "slowdown": (persist_slowdown(self.steps, s.began + s.blocked_s, end, baseline)
                                     if s.future is not None and end is not None else None)})
        return out

    def facts(self, measured: list[float], first_step_s: float | None) -> dict:
        """This rank's saves and a plain write of its largest share to the same directory (after the
        window); a restore's phases with the first step after it."""
        rows = self.rows(sorted(measured)[len(measured) // 2] if measured else 0.0)
        if self.restored is not None:
            self.restored["first_step_s"] = first_step_s
        return {"saves": rows, "wait_s": self.wait_s, "method": self.saver.method, "mode": self.mode,
                "restored": self.restored,
                "every": self.every, "dir": str(self.root),
                "plain_write": self.plain_write(max((r["bytes"] or 0 for r in rows), default=0))}

    def plain_write(self, nbytes: int) -> dict | None:
        """`nbytes` written to one file beside the checkpoints and fsynced, timed, removed: the rate this
        directory gives a plain write (the checkpoint's own rate is read against it)."""
        if not nbytes:
            return None
        path = self.root / f".plain-write-rank{self.rank}"
        block = b"\0" * min(nbytes, 1 << 24)
        t0 = time.perf_counter()
        try:
            with open(path, "wb") as f:
                left = nbytes
                while left > 0:
                    left -= f.write(block[:left])
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:     # the directory gone or full since: no comparison, said why
            path.unlink(missing_ok=True)
            return {"bytes": nbytes, "seconds": None, "bytes_per_s": None, "error": f"{type(exc).__name__}: {exc}"}
        seconds = time.perf_counter() - t0
        path.unlink()
        return {"bytes": nbytes, "seconds": seconds, "bytes_per_s": rate(nbytes, seconds)}
