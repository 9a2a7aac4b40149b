"""Run one cell: `python -m ddlbench.sweep.task SWEEP_DIR [INDEX]` (INDEX defaults to
SLURM_ARRAY_TASK_ID). Skips a cell that already has an ok result; a previous non-ok attempt is
kept under <sweep>/.attempts/<cell>/<n>/ and the cell runs again. `bench run` is forked from
this process with an argument list (no shell), so override values reach it literally, and
after the first cell it starts without paying torch's imports again (ddlbench.launch.forked)."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.launch.forked import Forked
from ddlbench.lifecycle.signals import Stopped, name_of, stop_child
from ddlbench.lifecycle.stop import ForwardUsr1
from ddlbench.record import rundir
from ddlbench.sweep import manifest


def archive_attempt(sweep_dir: Path, run_dir: Path) -> None:
    """Move a previous attempt aside (<sweep>/.attempts/<cell>/<n>/; hidden, so reports do not
    count it) so the cell's directory holds exactly one result."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    attempts = Path(sweep_dir) / ".attempts" / run_dir.name
    attempts.mkdir(parents=True, exist_ok=True)
    shutil.move(str(run_dir), attempts / str(len(list(attempts.iterdir())) + 1))


def quoted_override(key: str, value: str) -> str:
    """key='value' in Hydra's override grammar: a path with spaces, commas (a sweep list
    otherwise), brackets or quotes reaches the config as one literal string."""
    # Hydra reads backslashes literally except a run of them before a quote (or the closing
    # quote), which it halves: double exactly those runs, then escape the quotes.
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"{key}='{escaped}'"


def cell_lock(sweep_dir: Path, cell_id: str):
    """An exclusive flock on <sweep>/.locks/<cell>.lock, waited for if another process holds it
    (a resume while an interrupted sweep's cell still runs). The `bench run` child inherits the
    locked descriptor, so the lock lives exactly as long as the cell's run, even if this
    process is killed."""
    locks = Path(sweep_dir) / ".locks"
    locks.mkdir(exist_ok=True)
    f = open(locks / f"{cell_id}.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"cell {cell_id}: another process is running it; waiting for it to finish", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
    return f


def run_cell(sweep_dir: Path, index: int, extra_env: dict | None = None) -> int:
    cells = manifest.read(sweep_dir)
    cell = cells[index]
    with cell_lock(sweep_dir, cell.id):
        done = manifest.cell_result(sweep_dir, cell)
        if done is not None and done.get("status") == "ok":
            print(f"cell {cell.id}: already ok, skipped")
            return 0
        run_dir = manifest.cell_dir(sweep_dir, cell)
        archive_attempt(sweep_dir, run_dir)
        args = [*cell.overrides, quoted_override("run.dir", str(run_dir))]
        if not any(o.split("=", 1)[0].lstrip("+") == "run.progress" for o in cell.overrides):
            args.append("run.progress=false")   # a sweep's cells log to files
        launcher = _launcher(cell.overrides)
        # run.micro_batch=auto's memory profile: once per sweep (a forked cell inherits the sweep's; an
        # array task in another process reads the sweep's cache)
        extra_env = {rundir.PROFILE_CACHE_ENV: str(rundir.profile_cache(sweep_dir)), **(extra_env or {})}
        # the cell stays in this process's group: what signals the group (Slurm's scancel, a
        # terminal's Ctrl-C) reaches it directly; a signal to this pid alone is passed on (stop_cell)
        if launcher is not None and launcher.name == "slurm":
            # a cell of launcher.nproc ranks on launcher.nodes nodes: one srun task per rank, in
            # this array task's allocation (ddlbench.sweep.slurm.cell_shape asked for it)
            proc = subprocess.Popen(srun_command(launcher, args), env={**os.environ, **(extra_env or {})})
        else:
            preload_for(cell.overrides)
            # the child inherits the locked descriptor (and passes it on to its ranks)
            proc = Forked(lambda: _bench_in_child(args, extra_env or {}))
        with ForwardUsr1(proc, group=False):   # `#SBATCH --signal=B:USR1@...` reaches this process
            try:
                return proc.wait()
            except (KeyboardInterrupt, Stopped) as exc:
                stop_cell(proc, exc, cell.id)
                raise


def stop_cell(proc, exc: BaseException, cell_id: str) -> None:
    """A stop signal reached the sweep: the running cell is stopped through its own clean-up and
    waited for (ddlbench.lifecycle.signals.stop_child); resume runs it again."""
    stop_child(proc, exc, f"cell {cell_id}")


def srun_command(launcher, args: list[str]) -> list[str]:
    """The ranks of a launcher=slurm cell: `bench run` in each of launcher.nproc srun tasks on
    launcher.nodes nodes; one rank failing ends the others."""
    return ["srun", f"--nodes={launcher.nodes}", f"--ntasks={launcher.nproc}", "--kill-on-bad-exit=1",
            sys.executable, "-m", "ddlbench.cli", "run", *args]


def _launcher(overrides: list[str]):
    """The cell's launcher config, or None when its config is bad (left to fail in the run)."""
    from ddlbench.planning.config import plan_from_overrides
    try:
        return plan_from_overrides(overrides).cfg.launcher
    except ConfigError:
        return None


def preload_for(overrides: list[str]) -> None:
    """Import what the cell's ranks will need here, once per sweep process, so every forked
    cell after the first starts warm. A cell whose config is bad is left to fail in its child."""
    from ddlbench.launch.local import device_type, start_method
    from ddlbench.launch.starters import preload
    from ddlbench.planning.config import plan_from_overrides
    try:
        plan = plan_from_overrides(overrides)
    except ConfigError:
        return
    if start_method(plan, device_type(plan.cfg)) == "fork":
        preload(plan)


def _bench_in_child(overrides: list[str], extra_env: dict) -> int:
    from ddlbench.launch.run_entry import run_or_exit_code
    os.environ.update(extra_env)
    return run_or_exit_code(overrides)


def main(argv: list[str]) -> int:
    from ddlbench.lifecycle.signals import install
    install()       # scancel's SIGTERM reaches this array task: stop the cell, then end
    sweep_dir = Path(argv[0])
    index = int(argv[1]) if len(argv) > 1 else int(os.environ["SLURM_ARRAY_TASK_ID"])
    return run_cell(sweep_dir, index)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except (KeyboardInterrupt, Stopped) as stop:
        from ddlbench.lifecycle.signals import exit_code
        print(f"sweep task: stopped by {name_of(stop)}", file=sys.stderr)
        code = exit_code(stop)
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter finalisation (torch's and transformers' modules: seconds on a busy node): a
    # cancelled task ends when its cell has, not seconds later
    os._exit(code)
