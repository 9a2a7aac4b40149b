"""Launcher `slurm`: the process `srun` started IS a rank (one task per GPU / per CPU rank).

    srun --ntasks=8 --kill-on-bad-exit=1 bench run launcher=slurm framework=ddp run.dir=...

The variant's starter adds what its framework needs (Horovod: slots and a rendezvous).
Rank, world size and local rank come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; the
master address is the first host of SLURM_JOB_NODELIST; the port is derived from the job and
step ids, so array tasks sharing a node never clash. Rank 0 saves the config and writes the
result; a rank that fails writes a `failed` result naming itself (unless an ok or timeout one
exists, or the rank is stopping on SIGUSR1).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import traceback
from pathlib import Path

from ddlbench.cluster.device_task import master_host
from ddlbench.errors import ConfigError
from ddlbench.lifecycle.signals import STOP_SIGNALS
from ddlbench.lifecycle.stop import stopping
from ddlbench.planning.config import Plan
from ddlbench.record.results import Record, error_info, load_result
from ddlbench.record.rundir import RunDir


def first_host(nodelist: str) -> str:
    """First hostname of a Slurm node list ('gpu[03-05,09],cpu1' -> 'gpu03')."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10, stdin=subprocess.DEVNULL)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (FileNotFoundError, subprocess.TimeoutExpired):
        pass
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist)
    if not m:
        raise ConfigError(f"cannot parse SLURM_JOB_NODELIST {nodelist!r}")
    return m.group(1) + (m.group(2) or "")


def master_port(job_id: int, step_id: int) -> int:
    """A port in [20000, 40000) from the job and step: distinct for array tasks on one node."""
    return 20000 + (job_id * 31 + step_id) % 20000


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node `node_id` from SLURM_TASKS_PER_NODE ('4(x2),3' -> [4, 4, 3])."""
    from ddlbench.launch.hvd_slurm import tasks_per_node as expand
    counts = expand(tasks_per_node)
    if not 0 <= node_id < len(counts):
        raise ConfigError(f"SLURM_NODEID {node_id} is outside SLURM_TASKS_PER_NODE {tasks_per_node!r}")
    return counts[node_id]


def rank_env(environ=os.environ) -> dict:
    missing = [k for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NODELIST") if k not in environ]
    if missing:
        raise ConfigError(f"launcher=slurm must run under srun (missing {', '.join(missing)})")
    step = environ.get("SLURM_STEP_ID", "0")
    # LOCAL_WORLD_SIZE: the ranks on this node, which node-aware strategies read (DASO's nodes,
    # HSDP's shard groups, intra/inter-node labels of the comm probe)
    local = (tasks_on_node(environ["SLURM_TASKS_PER_NODE"], int(environ.get("SLURM_NODEID", "0")))
             if environ.get("SLURM_TASKS_PER_NODE") else int(environ["SLURM_NTASKS"]))
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_NTASKS"],
            "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(local),
            "MASTER_ADDR": master_host(first_host(environ["SLURM_JOB_NODELIST"]), environ),
            "MASTER_PORT": str(master_port(int(environ["SLURM_JOB_ID"]), int(step) if step.isdigit() else 0))}


def task_threads(environ=os.environ) -> int:
    """SLURM_CPUS_PER_TASK if set; else this task's CPUs shared by the tasks on this node (without
    task binding every task sees all cores)."""
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(environ["SLURM_CPUS_PER_TASK"])
    m = re.match(r"(\d+)", environ.get("SLURM_TASKS_PER_NODE", "1"))
    return max(1, len(os.sched_getaffinity(0)) // int(m.group(1) if m else 1))


class SlurmLauncher:
    """ddlbench/launch/base.py's interface where srun started this process as one rank."""

    def launch(self, plan: Plan, run_dir: Path) -> Record | None:
        return run_slurm(plan, run_dir)


def run_slurm(plan: Plan, run_dir: Path) -> Record | None:
    """Run this task's rank; rank 0 returns the record."""
    from ddlbench.launch.local import device_type
    from ddlbench.launch.records import finish, save_config
    from ddlbench.launch.worker import run_rank

    env = rank_env()
    if int(env["WORLD_SIZE"]) != plan.dims.world_size:
        raise ConfigError(f"launcher.nproc={plan.dims.world_size} but srun started {env['WORLD_SIZE']} tasks")
    # the same refusal as the local launcher, before any rank joins a process group: rank 0
    # writes the `unsupported` result, every task exits
    try:
        device = device_type(plan.cfg)
    except ConfigError as exc:   # srun gave GPUs that CUDA cannot use: say so, train nothing
        if int(env["RANK"]) == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            return finish(run_dir, run_dir.name, plan, "failed", error_info("no_gpu", str(exc)))
        return None
    reason = plan.variant.unsupported_reason(plan.cfg, device)
    if reason:
        if int(env["RANK"]) == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            return finish(run_dir, run_dir.name, plan, "unsupported", error_info("unsupported", reason))
        return None
    starter = plan.variant.starter()
    starter.slurm_env(plan, env)
    os.environ.update(env)
    rank = int(env["RANK"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        save_config(plan, run_dir)
    threads = plan.cfg.launcher.threads_per_rank or task_threads()
    # this task is a rank: scancel's SIGTERM ends it at once, also inside a collective (a Python
    # handler would wait for gloo/NCCL to return); srun's step ends with it
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    try:
        with starter.slurm_session(env):
            run_rank(str(run_dir), threads, plan=plan)
    except BaseException as exc:
        _record_failure(plan, run_dir, rank, exc)
        raise
    return Record.from_json(load_result(RunDir(run_dir).result)) if rank == 0 else None


KEPT_STATUSES = ("ok", "timeout")     # a later rank's failure never replaces these


def _record_failure(plan: Plan, run_dir: Path, rank: int, exc: BaseException) -> None:
    """A `failed` result naming this rank, unless the run already has an ok or timeout result, or
    this rank is stopping on SIGUSR1 (its collective failed because a stopped peer exited: rank 0
    writes the `timeout` result, srun --kill-on-bad-exit ends this rank a moment later)."""
    path = RunDir(run_dir).result
    if stopping() or (path.exists() and load_result(path).get("status") in KEPT_STATUSES):
        return
    import socket

    from ddlbench.launch import liveness
    host = socket.gethostname()     # across nodes, which host's rank failed, and which node was lost
    diagnosis = liveness.diagnose()
    message = f"rank {rank} on {host}: {str(exc) or type(exc).__name__}"
    if diagnosis:
        message = f"{liveness.summary(diagnosis)}; {message}"
    record = Record.new(run_dir.name, plan.raw, status="failed", precision=plan.cfg.run.precision,
                        error=error_info(type(exc).__name__, message, rank, host=host,
                                         lost_nodes=diagnosis["lost_nodes"] if diagnosis else None, peers=diagnosis,
                                         traceback="".join(traceback.format_exception(exc))[-4000:]))
    record.parallel = {**plan.dims.as_dict(), **plan.choices}
    record.write(run_dir)
