"""Shared helpers: real `bench` runs on CPU/gloo, tiny presets, few steps.

`bench(...)` forks the command from this (warm) pytest process instead of starting a new
interpreter: the same `bench.cli.main`, real launcher, real agent and rank processes and real
gloo collectives, without paying torch's and transformers' imports (~9 s) per run. Two rules
make that safe (bench/launch/forked.py): this process never runs a multi-threaded OpenMP region
(torch is pinned to one thread here), and nothing here touches CUDA.

This process is also a child subreaper: a process that outlives the run it belongs to is
re-parented here, so every `bench(...)` call checks that no process is left behind (and kills
what is). Tests that need the console script itself use `bench_exe(...)`.
"""
from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "bench.cli"]
BENCH_EXE = str(REPO / ".venv" / "bin" / "bench")
PR_SET_CHILD_SUBREAPER = 36


def _warm_up() -> None:
    import torch
    torch.set_num_threads(1)  # see the module docstring: forked children may then use any count
    import models  # noqa: F401
    from bench import runner  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    import torchvision.models  # noqa: F401
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


_warm_up()


def children() -> dict[int, str]:
    """This process's live children: pid -> command line."""
    me, out = os.getpid(), {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me:
                pid = int(stat.parent.name)
                out[pid] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    return out


def kill_and_reap(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _child(args, cwd: Path, env: dict | None) -> int:
    from bench.cli import main
    os.chdir(cwd)
    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        del os.environ[k]
    os.environ.update(env or {})
    # pytest replaced sys.stdout/err with its capture objects; write to the real fds 1 and 2
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    return main(list(args))


def bench(*args: str, cwd: Path | None = None, timeout: float = 240,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """`bench ARGS` forked from this process; asserts that it left no process behind. On
    timeout (kept below pytest's 300 s so this cleanup runs): SIGTERM (the launcher kills its
    ranks and writes a result), then SIGKILL, then the leftovers."""
    from bench.launch.forked import Forked

    before = set(children())
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = Forked(lambda: _child(args, cwd or REPO, env), new_session=True,
                      stdout=out.fileno(), stderr=err.fileno())
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            left = {p: c for p, c in children().items() if p not in before}
            kill_and_reap(left)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(["bench", *args], proc.returncode,
                                             out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    if timed_out:
        raise subprocess.TimeoutExpired(result.args, timeout, result.stdout, result.stderr)
    assert not left, f"processes outlived `bench {' '.join(args[:3])} ...`: {left}"
    return result


def bench_exe(*args: str, cwd: Path | None = None, timeout: float = 240, env: dict | None = None,
              **popen) -> subprocess.CompletedProcess:
    """The installed console script in a new interpreter (what a user types)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    full_env.update(env or {})
    return subprocess.run([BENCH_EXE, *args], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=full_env, **popen)


def run_record(run_dir: Path, *overrides: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    """`bench run` with test defaults; returns the process and the result record."""
    proc = bench("run", "logger=none", "run.progress=false", f"run.dir={run_dir}", *overrides,
                 timeout=timeout)
    path = run_dir / "result.json"
    assert path.exists(), f"no result.json\nstdout:{proc.stdout}\nstderr:{proc.stderr[-3000:]}"
    return proc, json.loads(path.read_text())


def wait_for(done, timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    """Poll `done()` until true; fail naming `what` after `timeout_s` (a bound on a hang, not a
    performance assertion)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"gave up after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
