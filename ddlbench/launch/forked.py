"""Start a child by fork() instead of a new interpreter, so it inherits what this process has
already imported (torch alone costs ~3 s per interpreter on a 2-core machine; torch with
transformers' GPT-2 ~9 s).

Three hazards decide when forking is safe, each with a test:
- OpenMP: a child forked after the parent ran a multi-threaded OpenMP region hangs in its
  first parallel region (GNU libgomp's pool does not survive fork). The launcher and the sweep
  only import torch; they never compute with it before they fork.
- CUDA: a child forked after the parent touched the CUDA driver (even `torch.cuda.is_available()`)
  cannot use the GPU. Ranks on GPUs are therefore spawned (fresh interpreters), never forked.
- A lock held by another thread at the fork stays locked in the child. The elastic agent forks its
  ranks one after another while its TCPStore's server thread serves the ranks forked before; that
  thread formats each peer's address with getnameinfo(), which holds glibc's resolver lock
  (resolv/resolv_conf.c `get_locked_global`) through the lookup: an IPv6 address /etc/hosts does
  not name goes to DNS, up to the resolver's 5 s timeout where a query is lost. A rank forked then
  hangs in its own connect (c10d's SocketImpl formats the address too) until its timeout: seen as
  one rank of eight "stuck in `_create_c10d_store`" under load, and reproduced by a process serving
  a TCPStore while it forks clients (gdb: the child waits on that lock; benchmarks/
  fork_store_hazard.py). So a forked rank connects only once its agent has forked all of them
  (`await_siblings`), when no fork is left to catch the lock.

The child starts with everything the parent had made frozen (`gc.freeze()` just before the fork;
the parent unfreezes at once), as Python's gc documentation advises for fork without exec: the
child's collections then skip the ~500,000 objects imports made instead of walking them, and
writing their headers, which copied each page they sit on (the collection before a rank's loop took
1.5 s median, up to 4 s, per rank of the suite's forked CPU runs: `timing.host_events`).
"""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from ddlbench.lifecycle.signals import Stopped
from ddlbench.lifecycle.signals import exit_code as _stop_exit_code
from ddlbench.rank.gcpolicy import INHERITED_FROZEN_ENV

RESET_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)


def rank_start_method(device_type: str) -> str:
    """How the elastic agent starts ranks: fork on CPU (imports inherited); spawn on CUDA."""
    return "fork" if device_type == "cpu" else "spawn"


# True in a process whose heap was frozen here (a child of fork_frozen, or after freeze_for_forked_ranks);
# inherited by its own children. A flag, not gc.get_freeze_count(), which walks every frozen object.
_frozen = False


def fork_frozen() -> int:
    """os.fork() with everything the parent made frozen in the child (see the module docstring). The
    parent's collector as it was: unfrozen again at once, unless it had frozen objects already (a
    forked child forking in turn: what it inherited frozen stays so, and what it made since with it)."""
    global _frozen
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        _frozen = True
    elif not _frozen:
        gc.unfreeze()
    return pid


def inherited_heap() -> bool:
    """True in a process forked here or from a parent that froze its heap for forked ranks (and in
    such a parent); False in a spawned interpreter."""
    return _frozen


def freeze_for_forked_ranks() -> None:
    """In the agent, before torch forks its ranks: its objects frozen for them, and how many in the
    environment they inherit (counting walks every frozen object, ~0.25 s for 470,000 on a busy
    2-core VM: once here rather than in each rank; ddlbench/rank/gcpolicy.py records it)."""
    global _frozen
    _frozen = True
    gc.freeze()
    os.environ[INHERITED_FROZEN_ENV] = str(gc.get_freeze_count())


SIBLINGS_WAIT_S = 30.0   # bounds the wait when a sibling ended (reaped) before the last was forked


def children_of(pid: int) -> list[int]:
    """The processes `pid` has forked and not yet reaped: Linux's /proc/PID/task/PID/children
    (children of its main thread, which is where torch forks ranks), or `scan_children` where the
    kernel lacks that file."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return scan_children(pid)


def scan_children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from every /proc/N/stat (field 4, after the name)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def await_siblings(expected: int, timeout_s: float = SIBLINGS_WAIT_S, poll_s: float = 0.002) -> bool:
    """In a forked rank, before it connects to anything: wait until this process's parent has
    forked `expected` children (the module docstring's third hazard). True once it has; False at
    the deadline (a sibling that ended before the last fork: the launch fails on its own)."""
    parent = os.getppid()
    deadline = time.monotonic() + timeout_s
    while len(children_of(parent)) < expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def exit_code(status: int) -> int:
    """A waitpid status as subprocess.Popen.returncode: the exit code, or -N for signal N."""
    return os.waitstatus_to_exitcode(status)


class Forked:
    """A forked child that runs `target()` and exits with its return value (an int, or 0 for
    None; 1 and a traceback on stderr for an exception). The handle offers the part of
    subprocess.Popen the launchers use: pid, returncode, poll(), wait(timeout), send_signal()."""

    def __init__(self, target: Callable[[], int | None], *, new_session: bool = False,
                 stdout: int | None = None, stderr: int | None = None):
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = fork_frozen()
        if self.pid == 0:
            self._child(target, new_session, stdout, stderr)

    @staticmethod
    def _child(target, new_session: bool, stdout: int | None, stderr: int | None) -> None:
        code = 1
        try:
            for sig in RESET_SIGNALS:            # the parent's handlers are not the child's
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if new_session:                      # its own process group: killpg reaches its tree
                os.setsid()
            from ddlbench.lifecycle import ownership  # a sweep's or an advise's lock is its process's alone
            for fd in ownership.parent_only_fds():
                with contextlib.suppress(OSError):
                    os.close(fd)
            ownership.forget_parent_only()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            for fd, target_fd in ((stdout, 1), (stderr, 2)):
                if fd is not None:
                    os.dup2(fd, target_fd)
            ret = target()
            code = 0 if ret is None else int(ret)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except (KeyboardInterrupt, Stopped) as exc:   # a stop signal, handled on the way out: no traceback
            code = _stop_exit_code(exc)
        except BaseException:  # noqa: BLE001 - the child must always exit here, never return
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped elsewhere
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = exit_code(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                while True:
                    try:
                        _, status = os.waitpid(self.pid, 0)
                        break
                    except InterruptedError:
                        continue
                self.returncode = exit_code(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        delay = 0.005
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)
