"""Slurm back end: one job array, one array task per cell, submitted without blocking.

Every client call has a timeout (they block while slurmctld is down) and an argument list (no
shell); values substituted into the job script are shell-quoted."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.sweep import manifest

TEMPLATE = Path(__file__).resolve().parents[2] / "slurm" / "array.sbatch"
TIMEOUT_S = 30


class SlurmError(RuntimeError):
    pass


def _call(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{cmd[0]} did not answer within {TIMEOUT_S} s (is slurmctld up?)") from None
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(cmd[:2])}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def array_spec(indices: list[int], throttle: int | None) -> str:
    """`0-3`, `1,4,7`; `%N` runs at most N tasks at once."""
    if not indices:
        raise ValueError("no cells to submit")
    if indices == list(range(indices[0], indices[-1] + 1)):
        spec = f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    else:
        spec = ",".join(map(str, indices))
    return spec + (f"%{throttle}" if throttle else "")


def write_script(sweep_dir: Path, workdir: Path) -> Path:
    text = TEMPLATE.read_text()
    for key, value in (("@WORKDIR@", workdir), ("@PYTHON@", sys.executable), ("@SWEEP_DIR@", sweep_dir.resolve())):
        text = text.replace(key, shlex.quote(str(value)))
    path = sweep_dir / "array.sbatch"
    path.write_text(text)
    return path


@dataclass(frozen=True)
class Shape:
    """What one array task asks Slurm for."""
    nodes: int
    ntasks: int
    cpus_per_task: int

    def sbatch_args(self) -> list[str]:
        return [f"--nodes={self.nodes}", f"--ntasks={self.ntasks}", f"--cpus-per-task={self.cpus_per_task}"]


def cell_shape(launcher, cpus_per_rank: int) -> Shape:
    """A cell with the local launcher: one task on one node holding all its ranks. A cell with
    launcher=slurm (launcher.nodes, launcher.nproc): one task per rank on that many nodes, which
    the array task starts with srun (ddlbench/sweep/task.py)."""
    if launcher.name == "slurm":
        return Shape(launcher.nodes, launcher.nproc, cpus_per_rank)
    return Shape(1, 1, launcher.nproc * cpus_per_rank)


def submit(sweep_dir: Path, indices: list[int], *, shape: Shape, time_limit_min: int,
           throttle: int | None, job_name: str, extra: list[str] = ()) -> str:
    if not re.fullmatch(r"[\w.-]{1,64}", job_name):
        raise ConfigError(f"--job-name {job_name!r}: use letters, digits, '.', '_' or '-'")
    script = write_script(sweep_dir, Path.cwd())
    (sweep_dir / manifest.LOGS).mkdir(exist_ok=True)
    cmd = ["sbatch", "--parsable", f"--array={array_spec(indices, throttle)}", f"--job-name={job_name}",
           f"--output={sweep_dir.resolve() / manifest.LOGS}/%A_%a.out", *shape.sbatch_args(),
           f"--time={time_limit_min}", *extra, str(script)]
    return _call(cmd).strip().split(";")[0]


def queued(job_ids: list[str]) -> dict[int, str]:
    """Array index -> Slurm state (PENDING, RUNNING, ...) of the tasks still in the queue."""
    if not job_ids:
        return {}
    out = _call(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%K %T"])
    states = {}
    for line in out.splitlines():
        idx, _, state = line.strip().partition(" ")
        if idx.isdigit():
            states[int(idx)] = state
    return states


def accounted(job_ids: list[str]) -> dict[int, dict]:
    """Array index -> the accounting record (sacct) of its latest attempt: state (CANCELLED,
    TIMEOUT, OUT_OF_MEMORY, FAILED, NODE_FAIL, COMPLETED...), exit code, job id. {} when the
    cluster keeps no accounting (sacct then fails); sacct lags squeue by a second or two."""
    if not job_ids:
        return {}
    try:
        out = _call(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode"])
    except SlurmError:
        return {}
    order = {job: i for i, job in enumerate(job_ids)}
    found: dict[int, dict] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        job, _, index = parts[0].partition("_")
        if not index.isdigit() or job not in order:
            continue
        row = {"job": parts[0], "state": parts[1].split()[0], "detail": parts[1], "exit_code": parts[2],
               "attempt": order[job]}
        if int(index) not in found or row["attempt"] >= found[int(index)]["attempt"]:
            found[int(index)] = row
    return found
