"""How a variant's ranks are started: its `rank_starter` (ddlbench/adapters/variant.py). The local
launcher asks it for the process tree that starts the ranks on this machine; the Slurm launcher,
where srun already started them, for the environment and the session each task runs in. The
default is torch's elastic agent; a framework with its own launcher has a starter of its own
(Horovod: ddlbench/launch/horovod.py)."""
from __future__ import annotations

import contextlib
from pathlib import Path


class Elastic:
    """torch's elastic agent, forked from the launcher into its own session (ranks forked in turn
    inherit the imports preloaded here; spawned ranks import their own). Under srun each task is a
    rank as it is."""

    def local(self, plan, run_dir: Path, threads: int, method: str):
        from ddlbench.launch import agent
        from ddlbench.launch.forked import Forked
        if method == "fork":
            preload(plan)
        return Forked(lambda: agent.launch(run_dir, plan.cfg.launcher.nproc, threads,
                                           plan.cfg.launcher.monitor_interval_s, method,
                                           plan.cfg.launcher.max_restarts), new_session=True)

    def slurm_env(self, plan, env: dict) -> None:
        """Add to a task's rank environment (ddlbench.launch.slurm.rank_env) what the ranks need."""

    def slurm_session(self, env: dict):
        """What runs around a task's rank (a rendezvous server, say)."""
        return contextlib.nullcontext()


def preload(plan) -> None:
    """Import here, once, what every forked rank needs (the runner, the model's library, the
    adapter's framework) instead of in each rank. Imports only: nothing here may compute with
    torch before the fork (ddlbench.launch.forked)."""
    import importlib

    from ddlbench import models
    from ddlbench.rank import runner  # noqa: F401
    for module in preload_modules(plan, models.modules_for(plan.cfg.model)):
        try:
            importlib.import_module(module)
        except ImportError:     # not installed: the rank that needs it says so in its own error
            pass


# torch.compile's compiler: each rank imports it at its first compiled step otherwise (~3 s on a 2-core VM)
COMPILER_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")


def preload_modules(plan, model_modules=()) -> tuple[str, ...]:
    """What preload() imports for `plan`: the model's library, the variant's framework, the compiler
    when run.compile is on."""
    return (*model_modules, *plan.variant.preload_modules, *(COMPILER_MODULES if plan.cfg.run.compile else ()))
