"""One launch interface (after optimum-benchmark's launchers/base.py): a launcher starts the ranks
of a Plan in a run directory and returns the run's record where this process holds it: always on
this machine (launcher=local), on rank 0's task under srun (launcher=slurm), None on the others
(a ddlbench.record.results.Record).
How the ranks start inside it is the variant's starter (ddlbench/launch/starters.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol

from ddlbench.record.results import Record


class Launcher(Protocol):
    def launch(self, plan, run_dir: Path) -> Optional[Record]: ...


def launcher_for(plan, started: Optional[float] = None, validated: Optional[float] = None) -> Launcher:
    """launcher.name's launcher; `started`/`validated` feed the local launcher's start-up timeline."""
    if plan.cfg.launcher.name == "slurm":
        from ddlbench.launch.slurm import SlurmLauncher
        return SlurmLauncher()
    from ddlbench.launch.local import LocalLauncher
    return LocalLauncher(started, validated)
