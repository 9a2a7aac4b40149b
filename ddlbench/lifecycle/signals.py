"""How a `bench` command ends on a stop signal: SIGTERM (kill, scancel, a CI timeout), SIGHUP (a
closed terminal or ssh session) and SIGINT (Ctrl-C; Python's KeyboardInterrupt) all unwind the
command like an exception, so every process it started is stopped on the way out (the launcher
kills its agent's session, a sweep forwards the signal to its running cell and waits for it);
the command then prints one line and exits 128 + the signal's number. No traceback."""
from __future__ import annotations

import signal
import subprocess
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)   # SIGINT: Python raises KeyboardInterrupt itself
ALL_STOP_SIGNALS = (signal.SIGINT, *STOP_SIGNALS)


class Stopped(BaseException):
    """A stop signal arrived (not an Exception: `except Exception` must not swallow it, as with
    KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, _frame):
    raise Stopped(signum)


def install() -> None:
    """SIGTERM and SIGHUP raise Stopped in this process's main thread; SIGINT KeyboardInterrupt."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def signum_of(exc: BaseException) -> int:
    """The signal behind a Stopped or a KeyboardInterrupt."""
    return exc.signum if isinstance(exc, Stopped) else signal.SIGINT


def exit_code(exc: BaseException) -> int:
    return 128 + signum_of(exc)


def name_of(exc: BaseException) -> str:
    return signal.Signals(signum_of(exc)).name


def shield() -> None:
    """Ignore further stop signals: the clean-up after the first one must not be cut short by a
    second (a repeated Ctrl-C, a scheduler's repeated SIGTERM); the process is ending anyway."""
    for sig in ALL_STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


CHILD_STOP_GRACE_S = 60.0


def stop_child(proc, exc: BaseException, what: str, grace_s: float = CHILD_STOP_GRACE_S) -> None:
    """A stop signal reached this command while `proc` (a `bench` child: a sweep's cell, `bench
    context`'s run) runs: pass it on (the child's launcher kills its ranks and writes a
    `terminated`/`interrupted` result), wait for it (bounded; then SIGKILL), so nothing it started
    outlives this command or writes after it ended. Where the signal went to the whole group
    (Ctrl-C, scancel) the child has it already: it ignores a second one once stopping (shield)."""
    shield()
    sig = signum_of(exc)
    print(f"{what}: {name_of(exc)} received; stopping it", file=sys.stderr, flush=True)
    try:
        proc.send_signal(signal.SIGTERM if isinstance(proc, subprocess.Popen) and sig == signal.SIGINT else sig)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_child(cmd: list[str], what: str, **popen) -> int:
    """subprocess.run for a child that starts processes of its own (`bench run`): on a stop signal
    the child is stopped through its own clean-up (stop_child), never SIGKILLed alone with its
    ranks left running (subprocess.run kills only its direct child). Its exit code."""
    proc = subprocess.Popen(cmd, **popen)
    try:
        return proc.wait()
    except (KeyboardInterrupt, Stopped) as exc:
        stop_child(proc, exc, what)
        raise
