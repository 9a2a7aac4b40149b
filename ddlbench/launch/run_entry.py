"""`bench run` below the command line: one measured run from Hydra overrides. ddlbench/cli.py
(argparse) and the sweep's cells (ddlbench/sweep/task.py) both call it, so no module below the CLI
calls back up through it."""
from __future__ import annotations

import os
import sys

from ddlbench.errors import ConfigError
from ddlbench.record import rundir

EXIT_BAD_INPUT = 2
EXIT_RUN_NOT_OK = 1


def run(overrides: list[str]) -> int:
    """One run; ConfigError for bad input (the caller reports it)."""
    import time

    from ddlbench.lifecycle.events import process_start_time
    from ddlbench.planning.config import plan_from_overrides

    plan = plan_from_overrides(overrides)
    validated = time.time()
    if plan.cfg.run.dry_run:
        import json
        print(json.dumps({"parallel": plan.dims.as_dict(), "mesh": plan.dims.mesh_shape(),
                          "framework": plan.cfg.framework.model_dump(), "model": plan.cfg.model.model_dump(),
                          **plan.variant.dry_run_info(plan.cfg, plan.dims)}, indent=2))
        print("dry run: config is valid; nothing launched")
        return 0
    rd = rundir.for_run(plan)
    run_dir = rd.path
    if rd.result.exists():
        raise ConfigError(f"run.dir {run_dir} already holds a result.json; choose another run.dir")
    from ddlbench.launch.base import launcher_for
    from ddlbench.lifecycle import ownership, quiet
    from ddlbench.record.table import render, rows
    from ddlbench.sinks import log_to_sinks

    # before anything is written: a second run on this directory is refused (its agent and ranks
    # inherit the lock); the result check again under the lock (a run that finished meanwhile)
    ownership.refuse_foreign(run_dir)        # a directory of the user's is never written into
    with ownership.take(run_dir, "bench run") as owner:
        if rd.result.exists():
            raise ConfigError(f"run.dir {run_dir} already holds a result.json; choose another run.dir")
        os.environ[ownership.TOKEN_ENV] = owner.token     # the ranks check it before reading config.json
        _warn_nothing_fits(plan, run_dir)
        try:
            record = launcher_for(plan, started=process_start_time(), validated=validated).launch(plan, run_dir)
        finally:
            os.environ.pop(ownership.TOKEN_ENV, None)
            quiet.write_kept(rd.third_party_log)
        if record is None:  # a Slurm task other than rank 0: the result is rank 0's to report
            return 0
        log_to_sinks(plan, run_dir, record)
    print(render(rows([record.to_json()])))
    print(f"result: {rd.result}")
    return 0 if record.status == "ok" else EXIT_RUN_NOT_OK


def _warn_nothing_fits(plan, run_dir) -> None:
    """run.micro_batch=auto that found nothing fitting: said on the terminal and in the result's warnings."""
    from ddlbench.lifecycle import events
    from ddlbench.planning.microbatch import nothing_fits_warning
    text = nothing_fits_warning(plan.choices)
    if text:
        print(f"bench: warning: {text}", file=sys.stderr, flush=True)
        events.note(run_dir, text)


def run_or_exit_code(overrides: list[str]) -> int:
    """run(), with bad input reported as `bench run` reports it: one line on stderr, exit code 2."""
    try:
        return run(overrides)
    except ConfigError as exc:
        print(f"bench: config error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
