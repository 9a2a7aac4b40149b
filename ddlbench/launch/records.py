"""What a launcher writes into a run directory besides the ranks' own result: the resolved
config before anything starts, and the result of a run whose ranks could not write one
(unsupported, failed, timeout, stopped by SIGUSR1). Used by the local and the Slurm launchers."""
from __future__ import annotations

import re
from pathlib import Path

from ddlbench.lifecycle import events
from ddlbench.lifecycle.stop import partial_timing
from ddlbench.planning.config import Plan
from ddlbench.record.results import Record, atomic_write_json, error_info
from ddlbench.record.rundir import RunDir

CHOICES = "choices.json"


def save_config(plan: Plan, run_dir: Path) -> None:
    from omegaconf import OmegaConf
    rd = RunDir(run_dir)
    atomic_write_json(rd.config_json, plan.raw)
    rd.config_yaml.write_text(OmegaConf.to_yaml(OmegaConf.create(plan.raw)))
    if plan.choices:    # what validation decided (run.micro_batch=auto): ranks take it, not decide again
        atomic_write_json(rd.path / CHOICES, plan.choices)


def stopped_result(run_dir: Path, run_id: str, plan: Plan, elapsed: float) -> Record:
    """SIGUSR1 (time-limit warning): a `timeout` result with what the ranks measured so far."""
    from ddlbench import models
    spec = models.build(plan.cfg.model)
    part = partial_timing(run_dir, plan.dims.world_size, plan.dims.global_batch, spec.tokens_per_sample)
    done = part["steps_completed"] if part else 0
    record = ended_record(run_dir, run_id, plan, "timeout", error_info(
        "stopped", f"stopped by SIGUSR1 (time-limit warning) after {elapsed:.1f} s and {done} steps; "
                   "partial measurements kept", signal="SIGUSR1"))
    if part:
        record.sections["partial"] = part
        if "throughput" in part:
            record.throughput = part["throughput"]
            record.timing = {"warmup_steps": part["warmup_steps"], "measured_steps": part["measured_steps"],
                             "step_time_s": part["step_time_s"], "series_s": part["series_s"],
                             "clock": "time.perf_counter at step boundaries (partial: stopped early)"}
        record.convergence["train_loss"] = part["train_loss"]
    record.write(run_dir)
    return record


def finish(run_dir: Path, run_id: str, plan: Plan, status: str, error: dict) -> Record:
    """The record of a run whose ranks wrote none (refused, failed, timed out), written."""
    record = ended_record(run_dir, run_id, plan, status, error)
    record.write(run_dir)
    return record


def ended_record(run_dir: Path, run_id: str, plan: Plan, status: str, error: dict) -> Record:
    """What the launcher knows of a run without the ranks' record: the plan, the error, the
    launcher's notes (events.note), the environment variables."""
    from ddlbench.machine.envinfo import env_vars
    record = Record.new(run_id, plan.raw, status=status, precision=plan.cfg.run.precision, error=error)
    record.parallel = {**plan.dims.as_dict(), **plan.choices}
    record.framework["grad_reduce_dtype"] = plan.variant.grad_reduce_dtype(plan.cfg.run.precision)
    record.env = {"env_vars": env_vars()}
    record.warnings = events.notes(events.read(run_dir))
    return record


_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


HELPER_THREADS = {"_accept_forever", "watch"}   # ddlbench's own background threads (launch/liveness.py,
                                                # launch/stop.py's SIGUSR1 thread)


def _in_package(path: str) -> str | None:
    """The path inside the ddlbench package of a frame's file, or None for anyone else's (a
    library under a checkout called ddlbench, .venv/.../site-packages/torch, is not ours)."""
    if "/ddlbench/" not in path:
        return None
    inside = path.rsplit("/ddlbench/", 1)[1]
    return None if "-packages/" in inside else inside


def _started_thread(frame: re.Match) -> bool:
    """A frame of a thread started with `threading` (its outermost frames are threading.py's
    `_bootstrap`): a helper such as the NVML sampler (ddlbench/machine/nvml.py), not the rank's main thread."""
    return frame["func"] == "_bootstrap_inner" and Path(frame["path"]).name == "threading.py"


def where_each_rank_was(stacks: dict[str, str]) -> str:
    """One line per rank from its stack dump (innermost_frames): the innermost frame of the
    thread that runs the rank (the one through ddlbench's own code that is not one of its helper
    threads nor any thread started with `threading`, else the first), and the
    innermost frame of ddlbench's code on it -- what a reader of a timeout needs first.
    "rank 1: faults.py:30 hang <- ddlbench/rank/runner.py:120 run; rank 0: ..."."""
    parts = []
    for rank in sorted(stacks, key=int):
        threads = [[m for m in map(_FRAME.match, block.splitlines()) if m]
                   for block in re.split(r"\n(?=\S)", stacks[rank])]
        threads = [t for t in threads if t]
        if not threads:
            continue
        ours = [t for t in threads if any(_in_package(m["path"]) for m in t)]
        work = [t for t in ours if not any(m["func"] in HELPER_THREADS or _started_thread(m) for m in t)]
        frames = (work or ours or threads)[0]
        where = f"{Path(frames[0]['path']).name}:{frames[0]['line']} {frames[0]['func']}"
        own = next((m for m in frames[1:] if _in_package(m["path"]) and not _in_package(frames[0]["path"])), None)
        if own is not None:
            where += f" <- ddlbench/{_in_package(own['path'])}:{own['line']} {own['func']}"
        parts.append(f"rank {rank}: {where}")
    return "; ".join(parts)


def innermost_frames(dump: str, frames: int = 8) -> str:
    """A faulthandler dump cut to each thread's header and its `frames` innermost frames (a
    forked rank's outer frames are its parent's, down to the interpreter's start)."""
    out, kept = [], 0
    for line in dump.splitlines():
        if not line.startswith(" "):
            out.append(line)
            kept = 0
        elif kept < frames:
            out.append(line)
            kept += 1
    return "\n".join(out)
