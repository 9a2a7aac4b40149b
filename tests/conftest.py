"""Shared helpers: real `bench` runs on CPU/gloo, tiny presets, few steps.

`bench(...)` forks the command from this (warm) pytest process instead of starting a new
interpreter: the same `ddlbench.cli.main`, real launcher, real agent and rank processes and real
gloo collectives, without paying torch's and transformers' imports (~9 s) per run. Two rules
make that safe (ddlbench/launch/forked.py): this process never runs a multi-threaded OpenMP region
(torch is pinned to one thread here), and nothing here touches CUDA.

While a `bench(...)` command runs, this process is a child subreaper: a process that outlives
the run it belongs to is re-parented here, so every call checks that no process is left behind
(and kills what is). Tests that need the console script itself use `bench_exe(...)`.

`make test` runs two workers (pytest-xdist, `-n $(TEST_WORKERS)`): about half the serial suite's
time waits (on processes, Slurm's scheduler, shaped links), so two workers keep both cores busy. A
test file runs whole on one worker; files that share something machine-wide run as one unit
(SHARED_GROUPS below). Serial `pytest` still works (what the `-n` flag adds is parallelism only).

Timeouts (the suite's rules, checked in tests/test_suite_rules.py):
- A timeout bounds one process, never a group of runs. `bench(...)`, `bench_exe(...)` and
  `run_record(...)` each bound their one command; while one runs, pytest-timeout's alarm is re-armed
  to that command's bound plus its clean-up (`_alarm`), and set back to the test's own timeout when it
  ends: the pytest timeout bounds the code between commands, so a fixture or test that runs several
  commands in turn is never judged by their sum.
- One documented factor for slow machines: DDLBENCH_TEST_TIME_SCALE (default 1) multiplies every such
  bound and every test's pytest timeout (`scaled`). On a machine half as fast as the one the bounds
  were set on, set it to 2. It changes no assertion.
- No assertion depends on how many rounds, repeats or retries a noisy measurement caused: a test of
  an adaptive loop (advise's rounds, outlier and verdict rules, calibrations) feeds it measurements
  it controls, or asserts what holds on every path (the answer is a measured candidate, the rounds
  stay within their cap).
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
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "ddlbench.cli"]
BENCH_EXE = str(REPO / ".venv" / "bin" / "bench")
PR_SET_CHILD_SUBREAPER = 36
TIME_SCALE = float(os.environ.get("DDLBENCH_TEST_TIME_SCALE") or 1)
# OpenMP threads that wait for work sleep at once instead of spinning first (libgomp reads this when
# torch loads it, so before torch is imported; the ranks forked from here and the commands started from
# here inherit it). The suite runs three workers on two cores: a 1-rank run (two threads) spun its idle
# thread while the other was descheduled: 82 CPU-s against 7 for the same run beside two busy loops
# (docs/setup.md, "A machine shared with other work"). Unloaded, passive waiting costs such a run ~25% of
# its wall time and nothing on 2-rank runs (one thread each); no test asserts a time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch.compile's runs (tests/test_compile.py) compile their kernels in the rank's own process: by default
# inductor starts a pool of compile workers per rank, each a fresh interpreter importing torch, which on
# this 2-core VM cost each compiled 2-rank run ~8 of its ~45 CPU-s (cold cache) and compiled nothing faster.
# The kernels are the same; set before torch reads it (torch._inductor.config, at its import)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
CLEANUP_S = 60          # a command's clean-up after its bound: SIGTERM, 15 s, SIGKILL, leftovers' grace
_test_timeout: list[float] = [0.0]      # the running test's pytest timeout (scaled), set per test below


def scaled(seconds: float) -> float:
    """A bound on a hang, stretched by the documented factor for slow machines."""
    return seconds * TIME_SCALE


def for_runs(n: int, each_s: float = 60) -> float:
    """The bound of one command that runs `n` runs in turn (a sweep, `bench advise`, a benchmark
    script): each run its own `each_s`, never the group squeezed under one figure. Unscaled, like
    the literal bounds it stands beside (bench() scales)."""
    return 30 + n * each_s


# Parallel workers (`make test` runs pytest-xdist): each test file is one unit of work, run whole on one
# worker (its module fixtures built once; the scheduler below). Files that share something machine-wide
# are one unit, run in turn: the machine's Slurm (scripts/slurm_local.sh: its daemons, ports, apt install)
# and the emulated clusters (namespaces n1, n2, head; 10.88.0.0/16).
SHARED_GROUPS = {"test_slurm": "slurm", "test_cluster": "slurm", "test_cluster_2d": "slurm"}
# Handed out longest first (profile of the fresh clone of 33cdc60, 2026-11-30, DDLBENCH_TEST_PROFILE: wall
# seconds per unit), so no long unit begins last and the run does not end on one worker: the Slurm unit
# (~900 s, mostly waiting on the scheduler and shaped links: ~40 CPU-s), the equivalence gate (~600 s),
# then every unit over ~90 s; the rest follow in collection order.
FIRST_GROUPS = ("slurm", "test_equivalence", "test_advise", "test_schedule", "test_benchmark_scripts",
                "test_memory_check", "test_estimate", "test_precision", "test_compile", "test_checkpoints",
                "test_published", "test_quality", "test_checkpointing", "test_moe", "test_runs")


def group_of(nodeid: str) -> str:
    stem = Path(nodeid.split("::")[0]).stem
    return SHARED_GROUPS.get(stem, stem)


def _first(nodeid: str) -> int:
    g = group_of(nodeid)
    return FIRST_GROUPS.index(g) if g in FIRST_GROUPS else len(FIRST_GROUPS)


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:     # serial pytest without the plugin: no scheduler to make
    LoadScopeScheduling = None
else:
    class ByGroup(LoadScopeScheduling):
        """xdist's load-scope scheduling with a test file (or a SHARED_GROUPS group) as the scope,
        handed out in collection order (FIRST_GROUPS first): xdist's own `loadgroup` marks no longer
        reach its scheduler under pytest 9.2 (it rewrites `item._nodeid`, which pytest no longer reads)."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False
        return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """Every test's pytest timeout (its mark, else --timeout) multiplied by TIME_SCALE; the longest
    groups first (see FIRST_GROUPS)."""
    items.sort(key=lambda item: _first(item.nodeid))      # stable: the rest keep their order
    default = float(config.getoption("timeout", None) or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        base = float(mark.args[0]) if mark and mark.args else float((mark.kwargs.get("timeout") if mark else None)
                                                                     or default)
        if base > 0:
            item.add_marker(pytest.mark.timeout(scaled(base)), append=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    mark = item.get_closest_marker("timeout")
    _test_timeout[0] = float(mark.args[0]) if mark and mark.args else 0.0
    yield
    _test_timeout[0] = 0.0


def _alarm(seconds: float | None) -> None:
    """Re-arm pytest-timeout's alarm (method signal, main thread) if it is armed: to `seconds`, or
    with None to the running test's own timeout. A process forked from here does not inherit it."""
    if threading.current_thread() is not threading.main_thread() or not _test_timeout[0]:
        return
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        signal.setitimer(signal.ITIMER_REAL, seconds if seconds is not None else _test_timeout[0])


class Bounded:
    """While a command runs, the test's alarm is its bound plus clean-up; after, the test's own."""

    def __init__(self, bound_s: float):
        self.bound_s = bound_s

    def __enter__(self):
        _alarm(max(self.bound_s + CLEANUP_S, _test_timeout[0]))

    def __exit__(self, *exc):
        _alarm(None)


def _warm_up() -> None:
    import torch
    torch.set_num_threads(1)  # see the module docstring: forked children may then use any count
    import torchvision.models  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401

    from ddlbench import models  # noqa: F401
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.rank import runner  # noqa: F401

    # Hydra composed once here: its plugins found and its search path built before the forks, so each
    # run's own composition costs ~0.3-0.6 CPU-s less (a sweep's or advise's parent does the same for
    # its cells: it validates them before forking them)
    plan_from_overrides(["framework=ddp"])
    # Not DeepSpeed or torch's compiler, though launchers preload them for their runs: imported here
    # they made every run forked from this process ~1 CPU-s dearer (a larger heap to fork and copy:
    # 3.7 -> 4.7 CPU-s for a 2-rank gpt2_tiny run of 10 steps), more than DeepSpeed's runs saved.


_warm_up()


def subreaper(on: bool) -> None:
    """Adopt orphaned descendants (on) or let them go to init (off). On only while a `bench`
    command runs: daemons a fixture starts (Slurm) must not become this process's zombies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def children() -> dict[int, tuple[str, str]]:
    """This process's children: pid -> (state letter, command line)."""
    me, out = os.getpid(), {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:
                cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out[int(stat.parent.name)] = (fields[0], cmd.strip())
        except (OSError, ValueError, IndexError):
            continue
    return out


def leftovers(before: set[int], grace_s: float = 5.0) -> dict[int, str]:
    """Children that are not in `before` and still alive after `grace_s` (a process the run
    killed may take a moment to die). Dead ones (zombies re-parented here) are reaped."""
    deadline = time.monotonic() + grace_s
    while True:
        new = {p: v for p, v in children().items() if p not in before}
        for pid in [p for p, (state, _) in new.items() if state == "Z"]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        alive = {p: cmd for p, (state, cmd) in new.items() if state != "Z"}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


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
    from ddlbench.cli import main
    os.chdir(cwd)
    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        del os.environ[k]
    os.environ.update(env or {})
    # pytest replaced sys.stdout/err with its capture objects; write to the real fds 1 and 2
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    return main(list(args))


class BenchProcess:
    """`bench ARGS` forked from this process, running in the background in its own session."""

    def __init__(self, args, cwd: Path | None = None, env: dict | None = None):
        from ddlbench.launch.forked import Forked

        self.args, self.left = list(args), {}
        subreaper(True)
        self._before = set(children())
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.proc = Forked(lambda: _child(args, cwd or REPO, env), new_session=True,
                           stdout=self._out.fileno(), stderr=self._err.fileno())

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """End it if it still runs (SIGTERM: the launcher kills its ranks and writes a result;
        then SIGKILL), and kill whatever outlived it (kept in self.left)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.left.update(leftovers(self._before))
        kill_and_reap(self.left)
        subreaper(False)

    def assert_nothing_left(self) -> None:
        self.stop()
        assert not self.left, f"processes outlived `bench {' '.join(self.args[:3])} ...`: {self.left}"

    def completed(self) -> subprocess.CompletedProcess:
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
            f.close()
        return subprocess.CompletedProcess(["bench", *self.args], self.proc.returncode, *texts)


def bench_background(*args: str, cwd: Path | None = None, env: dict | None = None) -> BenchProcess:
    return BenchProcess(args, cwd, env)


def bench(*args: str, cwd: Path | None = None, timeout: float = 240,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """`bench ARGS` forked from this process, waited for; asserts that it left no process
    behind. `timeout` (scaled) bounds this one command; on it the command is stopped first, within
    the test's alarm (re-armed for this command, see the module docstring)."""
    timeout = scaled(timeout)
    timed_out = False
    with Bounded(timeout):
        run = BenchProcess(args, cwd, env)
        try:
            run.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            run.stop()
    result = run.completed()
    if timed_out:
        raise subprocess.TimeoutExpired(result.args, timeout, result.stdout, result.stderr)
    assert not run.left, f"processes outlived `bench {' '.join(args[:3])} ...`: {run.left}"
    return result


def bench_exe(*args: str, cwd: Path | None = None, timeout: float = 240, env: dict | None = None,
              **popen) -> subprocess.CompletedProcess:
    """The installed console script in a new interpreter (what a user types)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    full_env.update(env or {})
    return run_bounded([BENCH_EXE, *args], timeout, cwd=cwd or REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=full_env, **popen)


def run_bounded(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run of one command under its own (scaled) bound, the test's alarm re-armed for it."""
    with Bounded(scaled(timeout)):
        return subprocess.run(cmd, timeout=scaled(timeout), **kw)


def run_record(run_dir: Path, *overrides: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    """`bench run` with test defaults; returns the process and the result record. The run's own
    wall-clock bound is below this call's: a hung run ends as a `timeout` result whose error
    holds every rank's stack, rather than as a bare TimeoutExpired here."""
    if not any(o.startswith("run.timeout_s=") for o in overrides):
        overrides = (*overrides, f"run.timeout_s={max(scaled(timeout) - 30, 10):g}")
    if not any(o.startswith("run.comm_profile=") for o in overrides):
        # the profiled step after the window (torch.profiler: comm time, overlap) cost a short test run
        # of 2 ranks as much CPU as its steps; a test that reads rec["comm"]["time"] asks for it
        overrides = (*overrides, "run.comm_profile=false")
    if not any(o.startswith("run.form_timeout_s=") for o in overrides):
        # a rendezvous that hangs (a rank stuck connecting to the agent's store was seen about once a
        # suite, 127 s lost at the default 120 s, before ddlbench/launch/forked.py's await_siblings)
        # is restarted sooner; here ranks join their group within ~1 s of starting
        overrides = (*overrides, "run.form_timeout_s=45")
    if not any(o.startswith("run.form_retries=") for o in overrides):
        # ... and given a second restart: an 8-rank run under one busy core had a rank stuck there in both of
        # its attempts (2026-11-29, tests/test_equivalence.py's FSDP x TP x PP case; its cause is removed)
        overrides = (*overrides, "run.form_retries=2")
    proc = bench("run", "logger=none", "run.progress=false", f"run.dir={run_dir}", *overrides,
                 timeout=timeout)
    path = run_dir / "result.json"
    assert path.exists(), f"no result.json\nstdout:{proc.stdout}\nstderr:{proc.stderr[-3000:]}"
    return proc, json.loads(path.read_text())


def wait_for(done, timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    """Poll `done()` until true; fail naming `what` after `timeout_s` (a bound on a hang, not a
    performance assertion; scaled)."""
    timeout_s = scaled(timeout_s)
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"gave up after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)


# a run that stops itself at a known point: rank 0 holds at the start of step 3 (the hang fault), so
# steps 1 and 2 are measured behind it (debug=fast: warm-up 1) however slow the machine is; a stop
# sent then finds them (a fixed wait after the first step found none on a loaded machine)
HOLD_AT_STEP_3 = ("fault.kind=hang", "fault.rank=0", "fault.step=3", "fault.seconds=900")


def wait_until_held(run_dir: Path, timeout_s: float = 180) -> None:
    """Until rank 0 of the run at `run_dir` (started with HOLD_AT_STEP_3) holds at step 3: its
    <run_dir>/fault_fired exists (ddlbench/rank/faults.py)."""
    wait_for(lambda: (Path(run_dir) / "fault_fired").exists(), timeout_s, f"{run_dir}'s rank 0 to reach step 3")


def wait_until_training(run_dir: Path, ranks: int, timeout_s: float = 120, steps_s: float = 2.0,
                        event: str = "model_ready") -> None:
    """Wait until every rank has marked `event` on the start-up timeline (model_ready: its model
    built; first_step: its first training step done), then `steps_s` more for some training steps."""
    from ddlbench.lifecycle import events

    def ready() -> bool:
        return len({e["rank"] for e in events.read(run_dir) if e["event"] == event}) >= ranks
    wait_for(ready, timeout_s, f"{ranks} rank(s) of {run_dir} to reach {event}", 0.2)
    time.sleep(steps_s)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def emulated_cluster(name: str, *up_args: str):
    """`bench cluster up name=NAME UP_ARGS` for a test module (as root, the single-node Slurm's
    packages installed first): yields its cluster.json; whatever failed, `down` at the end."""
    if os.geteuid() != 0:
        pytest.fail("the cluster tests need root (CI runs as root)")
    run_bounded(["bash", str(REPO / "scripts" / "slurm_local.sh"), "install"], 280, check=True)
    bench_exe("cluster", "down", f"name={name}")
    try:
        proc = bench_exe("cluster", "up", *up_args, f"name={name}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield json.loads((Path("/var/tmp/ddlbench-cluster") / name / "cluster.json").read_text())
    finally:     # nothing of the cluster outlives the module
        bench_exe("cluster", "down", f"name={name}")



class _Profile:
    """DDLBENCH_TEST_PROFILE=FILE: one JSON line per test (set-up, call and tear-down together):
    its worker and start (epoch seconds), wall seconds, this process's CPU seconds and its reaped descendants' (the runs' launchers,
    agents and ranks). Where the suite's time goes, and how much of it waits rather than computes."""

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def _cpu() -> tuple[float, float]:
        import resource
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        began, t0, (s0, c0) = time.time(), time.monotonic(), self._cpu()
        yield
        t1, (s1, c1) = time.monotonic(), self._cpu()
        with open(self.path, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                                "began": round(began, 3), "wall": round(t1 - t0, 3), "self_cpu": round(s1 - s0, 3),
                                "children_cpu": round(c1 - c0, 3)}) + "\n")


def pytest_configure(config):
    if os.environ.get("DDLBENCH_TEST_PROFILE"):
        config.pluginmanager.register(_Profile(os.environ["DDLBENCH_TEST_PROFILE"]), "ddlbench-profile")
