"""The run directory: the one module that names a run's directory and every file in it.

    <run>/result.json        the record (ddlbench/record/results.py; schema in docs/design.md §6)
          config.json        the validated config that ran (config.yaml: the same, for people)
          metrics.jsonl      per-step metrics (ddlbench/rank/collect.py; W&B reads them back)
          events.jsonl       the launcher's timeline (ddlbench/lifecycle/events.py)
          failure.json       the elastic agent's description of a failed launch
          errors/rank<N>.*   a Horovod rank's first error, and its started/done markers
          partial/rank<N>.json  what a rank measured before a stop signal (ddlbench/lifecycle/stop.py)
          stacks/rank<N>.txt a rank's Python stacks, dumped when it hangs
          logs/              torchrun's per-rank stdout and stderr
          agent.log          the elastic agent's log
          wandb/             W&B's offline run
          checkpoints/step_<N>/  run.checkpoint's saves (run.checkpoint.dir elsewhere; ddlbench/rank/saves.py)
          owner.lock         who owns the directory while it runs (ddlbench/lifecycle/ownership.py)
          third_party.log    library log lines kept off the terminal (ddlbench/lifecycle/quiet.py)

Directories that hold many runs (a sweep's cells, `bench run -m`, `bench advise`) are named here
too; each has its owner.lock as well. Pure: no torch, no config import (a plan is read by attribute)."""
from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

RESULT = "result.json"
OWNER = "owner.lock"
OUTPUT_MARKER = ".made-by-ddlbench.json"   # in a report's, projection's or context's output directory: its files are ours
OUTPUTS = Path("outputs")


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def result(self) -> Path:
        return self.path / RESULT

    @property
    def config_json(self) -> Path:
        return self.path / "config.json"

    @property
    def config_yaml(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def failure(self) -> Path:
        return self.path / "failure.json"

    @property
    def errors(self) -> Path:
        return self.path / "errors"

    @property
    def partial(self) -> Path:
        return self.path / "partial"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def agent_log(self) -> Path:
        return self.path / "agent.log"

    @property
    def third_party_log(self) -> Path:
        return self.path / "third_party.log"

    @property
    def owner(self) -> Path:
        return self.path / OWNER

    @property
    def wandb(self) -> Path:
        return self.path / "wandb"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def rank_error(self, rank: int, suffix: str = "json") -> Path:
        return self.errors / f"rank{rank}.{suffix}"

    def rank_partial(self, rank: int) -> Path:
        return self.partial / f"rank{rank}.json"

    def rank_stacks(self, rank: int) -> Path:
        return self.path / "stacks" / f"rank{rank}.txt"

    def rank_stderr_logs(self, rank: int) -> list[Path]:
        """torchrun's stderr files of `rank`, over every restart attempt."""
        return sorted(self.logs.glob(f"*/attempt_*/{rank}/stderr.log"))


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def for_run(plan) -> RunDir:
    """`bench run`'s directory: run.dir when set; under Slurm one name every srun task agrees on;
    else outputs/runs/<time>_<framework>-<variant>_<model>_n<ranks>, never an existing one."""
    cfg = plan.cfg
    if cfg.run.dir:
        return RunDir(Path(cfg.run.dir))
    if cfg.launcher.name == "slurm":
        return RunDir(OUTPUTS / "runs" / f"slurm-{os.environ.get('SLURM_JOB_ID', 'nojob')}."
                                         f"{os.environ.get('SLURM_STEP_ID', '0')}")
    base = OUTPUTS / "runs" / (f"{_stamp()}_{cfg.framework.name}-{cfg.framework.variant}_{cfg.model.name}"
                               f"_n{plan.dims.world_size}")
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}_{i}")
    return RunDir(path)


def sweep_root(kind: str) -> Path:
    """A new directory of many runs: outputs/<kind>/<time> (kind: sweeps, multirun)."""
    return OUTPUTS / kind / _stamp()


def advise_root(model: str, devices: int) -> Path:
    return OUTPUTS / "advise" / f"{model}_n{devices}"


PROFILE_CACHE_ENV = "DDLBENCH_PROFILE_CACHE"   # set by a sweep for its cells (ddlbench/estimate/profile.py reads it)


def profile_cache(sweep_dir: Path) -> Path:
    """Where a sweep's cells share run.micro_batch=auto's memory profiles (hidden: reports skip it)."""
    return Path(sweep_dir) / ".cache" / "profiles"


def cell_name(index: int, label: str) -> str:
    """`bench run -m`'s readable cell directory: <index>_<swept values>."""
    return f"{index:03d}_{label or 'run'}".replace("/", "-")


def of_cell(sweep_dir: Path, cell) -> RunDir:
    """A sweep cell's run directory: its name when it has one (`bench run -m`), else its id."""
    return RunDir(Path(sweep_dir) / (getattr(cell, "name", None) or cell.id))
