"""Launcher `local`: N ranks on this machine, with a wall-clock bound and a result in every case.

The launcher (this process) never trains. It saves the resolved config, forks the elastic
agent into a new session (so it inherits this process's imports; see ddlbench.launch.forked),
waits at most run.timeout_s, and guarantees exactly one result.json: the ranks write it on
success; otherwise this process writes failed/timeout/oom/unsupported with the reason.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.launch.failures import is_lost_peer
from ddlbench.launch.forked import rank_start_method
from ddlbench.launch.records import finish, innermost_frames, save_config, stopped_result, where_each_rank_was
from ddlbench.lifecycle import events, signals
from ddlbench.lifecycle.stop import ForwardUsr1
from ddlbench.machine.envinfo import usable_cores
from ddlbench.planning.config import Plan
from ddlbench.record.results import Record, error_info, load_result
from ddlbench.record.rundir import RunDir

TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")
# What NCCL's watchdog prints before it aborts the process (SIGABRT): a collective timed out.
WATCHDOG_MARKER = "watchdog caught collective operation timeout"
OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "cannot allocate memory")


def stop_error(signum: int) -> dict:
    """The error of a run ended by a stop signal: `interrupted` (Ctrl-C) or `terminated` (SIGTERM:
    kill, scancel; SIGHUP: the terminal went away). `bench sweep resume` runs such a cell again."""
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
        return error_info("interrupted", "interrupted by the user (Ctrl-C); all ranks killed", signal=name)
    why = "kill, scancel" if signum == signal.SIGTERM else "the terminal or session that started it closed"
    return error_info("terminated", f"the launcher received {name} ({why}); all ranks killed", signal=name)


def threads_per_rank(plan: Plan) -> int:
    return plan.cfg.launcher.threads_per_rank or max(1, usable_cores() // plan.cfg.launcher.nproc)


def classify(failure: dict, log_tail: str = "") -> str:
    """Status from a rank failure: timeout (collective/watchdog), oom, or failed. A rank that
    NCCL's watchdog aborted (SIGABRT, no error file) is a timeout when its log says so."""
    text = f"{failure.get('message', '')} {failure.get('traceback') or ''}".lower()
    if any(m in text for m in OOM_MARKERS):
        return "oom"
    if any(m in text for m in TIMEOUT_MARKERS):
        return "timeout"
    if failure.get("signal") == "SIGABRT" and WATCHDOG_MARKER in log_tail.lower():
        return "timeout"
    return "failed"


def rank_log_tail(run_dir: Path, rank, limit: int = 65536) -> str:
    """The end of a rank's stderr under <run>/logs (torch elastic's layout), or ''."""
    if rank is None:
        return ""
    logs = RunDir(run_dir).rank_stderr_logs(rank)
    if not logs:
        return ""
    with open(logs[-1], "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode(errors="replace")


def dump_stacks(proc: subprocess.Popen, run_dir: Path, nproc: int, wait_s: float = 2.0) -> dict[str, str]:
    """Ask a hung run's ranks for their Python stacks (SIGUSR2: faulthandler, registered by each
    rank into <run>/stacks/rank<R>.txt; the agent ignores it), wait briefly, and return
    {rank: its threads' innermost frames}."""
    try:
        os.killpg(proc.pid, signal.SIGUSR2)
    except ProcessLookupError:
        return {}
    time.sleep(wait_s)
    out = {}
    for rank in range(nproc):
        path = RunDir(run_dir).rank_stacks(rank)
        if path.is_file() and path.stat().st_size:
            out[str(rank)] = innermost_frames(path.read_text(errors="replace"))
    return out


def _kill_tree(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the agent's whole session (agent + ranks), then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            # ranks may outlive the agent briefly; make sure the group is empty
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def start_method(plan: Plan, device_type: str) -> str:
    """launcher.start_method, or auto: fork on CPU, spawn on CUDA (ddlbench.launch.forked)."""
    chosen = plan.cfg.launcher.start_method
    return rank_start_method(device_type) if chosen == "auto" else chosen


def formed(evts: list[dict], nproc: int) -> bool:
    """Every rank of the latest launch attempt has joined the process group (its events after the
    last `launch` mark)."""
    last = max((i for i, e in enumerate(evts) if e["event"] == "launch"), default=-1)
    return len({e["rank"] for e in evts[last + 1:] if e["event"] == "process_group"}) >= nproc


def wait_formed(proc, run_dir: Path, nproc: int, bound_s: float) -> bool:
    """Wait until the ranks formed their process group or the run ended (True), or `bound_s`
    passed without either (False: a rendezvous that hangs; seen here as one gloo rank stuck
    connecting to the agent's store while the others waited for it, until forked ranks waited for
    their siblings: ddlbench/launch/forked.py)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if proc.poll() is not None or formed(events.read(run_dir), nproc):
            return True
        time.sleep(0.2)
    return formed(events.read(run_dir), nproc)


@dataclass(frozen=True)
class LocalLauncher:
    """ddlbench/launch/base.py's interface on this machine: `started`/`validated`, when the run's
    command began and its config was valid (the start-up timeline)."""
    started: float | None = None
    validated: float | None = None

    def launch(self, plan: Plan, run_dir: Path) -> Record:
        return run_local(plan, run_dir, self.started, self.validated)


def run_local(plan: Plan, run_dir: Path, started: float | None = None, validated: float | None = None) -> Record:
    """`started`/`validated`: when this run's command began and its config was valid (the
    start-up timeline, ddlbench.lifecycle.events). A launch whose ranks do not form their process
    group within run.form_timeout_s is killed and started again (run.form_retries times); the
    result's warnings say so and where each rank was (events.note: the record takes it when built).
    One exit: the record the ranks wrote, or the one this launcher writes for what ended the run
    (a stop signal is the only other way out: its record written, the signal raised on)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(plan, run_dir)
    events.mark(run_dir, "cli_start", t=started)
    events.mark(run_dir, "validated", t=validated)
    outcome = _refused(plan) or _launched(plan, run_dir)
    return outcome if isinstance(outcome, Record) else finish(run_dir, run_dir.name, plan, *outcome)


def _refused(plan: Plan) -> tuple[str, dict] | None:
    """(status, error) where the run cannot start here: GPUs asked for and none usable (no CPU run
    instead), or what the variant cannot run on this device."""
    try:
        device = device_type(plan.cfg)
        if device == "cuda":
            from ddlbench.machine.device import check_gpu_count
            from ddlbench.machine.gpus import visible_gpus
            check_gpu_count(plan.cfg.launcher.nproc, visible_gpus().count)
    except ConfigError as exc:
        return "failed", error_info("no_gpu", str(exc))
    reason = plan.variant.unsupported_reason(plan.cfg, device)
    return ("unsupported", error_info("unsupported", reason)) if reason else None


def _launched(plan: Plan, run_dir: Path) -> Record | tuple[str, dict]:
    """The ranks started (again, if they did not form in time) and waited for: the record they
    wrote, or (status, error) for how the run ended without one."""
    cfg = plan.cfg
    threads = threads_per_rank(plan)
    starter = plan.variant.starter()
    start = time.monotonic()
    nproc = cfg.launcher.nproc
    # the ranks live in the agent's own session: a stop signal to this process must end them too
    previous = {sig: signal.signal(sig, signals._raise) for sig in signals.STOP_SIGNALS}
    proc = None
    try:
        for attempt in range(1, cfg.run.form_retries + 2):
            events.mark(run_dir, "launch", attempt=attempt)
            os.environ["DDLBENCH_LAUNCH_ATTEMPT"] = str(attempt)   # the ranks inherit it (fault injection)
            # the process tree that starts the ranks, in its own session: the variant's starter
            # (torch's elastic agent, or the framework's own launcher)
            proc = starter.local(plan, run_dir, threads, start_method(plan, device_type(cfg)))
            bound = min(cfg.run.form_timeout_s, max(0.0, cfg.run.timeout_s - (time.monotonic() - start)))
            # no retry left, or run.timeout_s ends first: the run's own timeout takes over
            if attempt > cfg.run.form_retries or bound < cfg.run.form_timeout_s or wait_formed(proc, run_dir, nproc, bound):
                break
            stacks = dump_stacks(proc, run_dir, nproc)
            _kill_tree(proc)
            note = (f"launch attempt {attempt}: the ranks did not form their process group within "
                    f"run.form_timeout_s={cfg.run.form_timeout_s:g} s ({where_each_rank_was(stacks) or 'no rank answered'}); "
                    f"all ranks were killed and started again; the measurement is from attempt {attempt + 1}")
            events.note(run_dir, note)
            print(f"bench: warning: {note}", file=sys.stderr, flush=True)
        usr1 = ForwardUsr1(proc, group=True)   # Slurm's time-limit warning -> every rank
        with usr1:
            code = proc.wait(timeout=max(0.1, cfg.run.timeout_s - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        stacks = dump_stacks(proc, run_dir, cfg.launcher.nproc)
        _kill_tree(proc)
        msg = (f"run exceeded run.timeout_s={cfg.run.timeout_s:g} s (wall clock); all ranks killed; "
               f"where each rank was ({where_each_rank_was(stacks) or 'no rank answered'}); their stacks: error.stacks")
        return "timeout", error_info("timeout", msg, stacks=stacks)
    except (KeyboardInterrupt, signals.Stopped) as exc:
        signals.shield()        # a second signal must not cut the clean-up short
        error = stop_error(signals.signum_of(exc))
        # the record first: Slurm SIGKILLs KillWait seconds after its SIGTERM, which can come
        # before the ranks are gone; then again once they are (with what they noted meanwhile)
        finish(run_dir, run_dir.name, plan, "failed", error)
        if proc is not None:
            _kill_tree(proc)
        finish(run_dir, run_dir.name, plan, "failed", error)
        raise
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is signals._raise:     # not shielded: the run goes on (a sweep)
                signal.signal(sig, handler)
        os.environ.pop("DDLBENCH_LAUNCH_ATTEMPT", None)
        if proc is not None and proc.poll() is None:
            _kill_tree(proc)
    return _ended(plan, run_dir, code, usr1.received, time.monotonic() - start)


def _ended(plan: Plan, run_dir: Path, code: int, usr1: bool, elapsed: float) -> Record | tuple[str, dict]:
    """After the ranks' process tree exited with `code`: their record, a stopped run's (Slurm's
    time-limit warning came), or (status, error) from the first rank's failure or the agent's."""
    result_path = RunDir(run_dir).result
    if result_path.exists():
        record = Record.from_json(load_result(result_path))
        if code != 0 and record.status == "ok":
            # the measurement finished and was written; a rank failed afterwards (teardown): the one
            # fact that reaches result.json after its writer (with the sinks' `logging`)
            failure = _first_failure(run_dir) or {}
            record.warnings.append(f"a rank failed after the result was written: "
                                   f"{failure.get('message', f'exit code {code}')}")
            record.write(run_dir)
        return record
    if usr1:
        return stopped_result(run_dir, run_dir.name, plan, elapsed)
    failure = _first_failure(run_dir)
    if failure is None:
        return "failed", error_info("agent_failed", f"elastic agent exited with code {code} after {elapsed:.1f} s "
                                    f"without a result; see {run_dir}/agent.log")
    status = classify(failure, rank_log_tail(run_dir, failure.get("rank")))
    message = failure.get("message")
    if not message or message == "<NONE>":   # torch elastic's placeholder: no error file (a signal)
        how = f"was killed by {failure['signal']}" if failure.get("signal") else "exited without an error"
        message = f"rank {failure['rank']} {how} (exit code {failure.get('exitcode')})"
    err = error_info(failure.get("type", "rank_failed"), message, failure["rank"],
                     exitcode=failure.get("exitcode"), signal=failure.get("signal"),
                     traceback=failure.get("traceback"), ranks_failed=failure.get("ranks_failed"))
    if "UnsupportedError" in (failure.get("traceback") or ""):
        status = "unsupported"
    return status, err


def _first_failure(run_dir: Path) -> dict | None:
    """The elastic agent's failure.json, or the earliest per-rank error file (a starter without the agent)."""
    rd = RunDir(run_dir)
    if rd.failure.exists():
        return json.loads(rd.failure.read_text())
    err_dir = rd.errors
    started = sorted(int(p.stem[4:]) for p in err_dir.glob("rank*.started"))  # rank<N>.started
    silent = [r for r in started if not rd.rank_error(r).exists() and not rd.rank_error(r, "done").exists()]
    # earliest first, errors caused by a lost peer after the others (ddlbench.launch.agent.root_cause)
    errors = sorted(err_dir.glob("rank*.json"),
                    key=lambda p: (is_lost_peer(json.loads(p.read_text()).get("message")), p.stat().st_mtime))
    if silent:  # a rank that died without an error is the cause; the others' errors follow from it
        return {"rank": silent[0], "exitcode": None, "signal": None,
                "message": f"rank {silent[0]} exited without an error (killed by a signal?); "
                           f"{len(errors)} other rank(s) failed after it",
                "traceback": json.loads(errors[0].read_text()).get("traceback") if errors else None,
                "ranks_failed": silent}
    return json.loads(errors[0].read_text()) if errors else None


def device_type(cfg) -> str:
    """The run's device (ddlbench/machine/device.py): ConfigError where GPUs were asked for and CUDA is
    not available. Learnt from NVML: this process forks the agent (and a sweep forks this)."""
    from ddlbench.machine.device import launcher_device
    return launcher_device(cfg.run.device)
