"""`bench` command line. Bad input: one line on stderr, exit 2, no traceback.

  bench run [overrides...]        one measured run (Hydra overrides: framework=ddp model=... )
  bench run -m [overrides...]     one run per cell of the cross product of comma lists
                                  (framework=ddp,fsdp_full launcher.nproc=1,2; glob(*) for groups)
  bench table DIR...              a short table of the results under DIRs
  bench report DIR... [-o OUT]    summary.csv, report.md, report.html, PNG plots (--wandb: W&B Report)
  bench sweep [--backend local|slurm] [--dir D] [--repeats N] overrides...
                                  cells with stable ids + manifest; Slurm: one job array, returns
  bench sweep status DIR | bench sweep resume DIR
  bench advise model=M devices=N [budget_runs=K] [frameworks=...] [backend=local|slurm] ...
                                  candidates pruned, ranked by predicted step time, top-k measured
  bench advise resume DIR         the next phase (after a Slurm sweep finished)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ddlbench.cluster import device_task
from ddlbench.errors import ConfigError
from ddlbench.launch.run_entry import EXIT_BAD_INPUT, EXIT_RUN_NOT_OK
from ddlbench.launch.run_entry import run as cmd_run  # `bench run`; sweep cells call ddlbench.launch.run_entry directly
from ddlbench.lifecycle import quiet, signals


def cmd_multirun(overrides: list[str]) -> int:
    """`bench run -m`: a local sweep (ddlbench/sweep: manifest, per-cell lock, resumable with `bench
    sweep resume DIR`) whose cells have readable directories, <index>_<swept values>, under
    run.dir; one table of every cell's record at the end."""
    from ddlbench.record import rundir
    from ddlbench.record.table import render, rows
    from ddlbench.sweep import manifest
    from ddlbench.sweep.cells import expand
    from ddlbench.sweep.commands import start_cells

    given = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "run.dir"]
    rest = [o for o in overrides if o not in given]
    cells = expand(rest, readable_names=True)   # all valid before anything starts
    parent = Path(given[-1].split("=", 1)[1]) if given else rundir.sweep_root("multirun")
    start_cells(parent, cells, {"overrides": overrides, "repeats": 1, "command": "bench run -m"}, "local")
    records = [manifest.cell_result(parent, c) for c in cells]
    print(render(rows([r for r in records if r is not None])))
    print(f"results under: {parent}")
    ok = all(r is not None and r["status"] in ("ok", "unsupported") for r in records)
    return 0 if ok else EXIT_RUN_NOT_OK


def cmd_table(paths: list[str]) -> int:
    from ddlbench.record.table import table_for
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such path: {', '.join(missing)}")
    print(table_for(paths))
    print(f"results under: {' '.join(paths)}")
    return 0


REPORT_FILES = ["summary.csv", "report.md", "report.html"]


def cmd_report(paths: list[str], out: str | None, wandb: bool, replace: bool = False) -> int:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such path: {', '.join(missing)}")
    from ddlbench import report
    from ddlbench.lifecycle.ownership import claim_output

    out_dir = Path(out) if out else Path(paths[0]) / "report"
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"-o {out_dir}: exists and is not a directory (the report is a directory of files)")
    from ddlbench.record.results import find_results
    found = find_results(paths), report.load.missing_cells(paths)    # walked once: a sweep may hold 10k+ runs
    if not any(found):
        raise ConfigError("no result.json found under: " + " ".join(paths))
    claim_output(out_dir, "bench report", REPORT_FILES, "pass --replace", replace)
    try:
        rep = report.build(paths, out_dir, progress=sys.stderr.isatty(), found=found)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    n_bad = int((rep.summary["status"] != "ok").sum())
    print(f"{len(rep.summary)} runs ({n_bad} not ok), {len(rep.cells)} configurations, "
          f"{sum(1 for d in rep.parity['differs'] if d)} parity flag(s)")
    for name in ("summary.csv", "report.md", "report.html"):
        print(f"  {out_dir / name}")
    for path in rep.plots.values():
        print(f"  {path}")
    if wandb:
        from ddlbench.report.wandb_report import publish
        print(publish(rep))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description="Benchmark distributed training frameworks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="one measured run; args are Hydra overrides (key=value)")
    p_run.add_argument("-m", "--multirun", action="store_true",
                       help="sweep: one run per cell of the cross product of comma lists")
    p_run.add_argument("overrides", nargs="*")
    p_table = sub.add_parser("table", help="short table of results under the given dirs")
    p_table.add_argument("paths", nargs="+")
    p_rep = sub.add_parser("report", help="comparison report (csv, md, html, png) of results under dirs")
    p_rep.add_argument("paths", nargs="+", help="sweep or run directories (searched for result.json)")
    p_rep.add_argument("-o", "--out", help="output directory (default: <first path>/report)")
    p_rep.add_argument("--replace", action="store_true",
                       help="replace summary.csv, report.md and report.html in an output directory ddlbench did not write")
    p_rep.add_argument("--wandb", action="store_true",
                       help="also build a W&B Report over the runs (saved online; offline: spec file)")
    p_proj = sub.add_parser("project", help="project a result to other world sizes on a modelled network: "
                                            "`project RESULT network=NAME [world_sizes=[...]] [allocate=...]`, or a layout "
                                            "from its specification: `project model=M framework=F network=N hardware=H100 ...`")
    p_proj.add_argument("args", nargs="+")
    p_ctx = sub.add_parser("context", help="the longest sequence a layout fits on the device: estimated, then the "
                                           "boundary measured: `context model=M framework=F run.device_memory_gb=X "
                                           "[seq_lens=[...]] [measure=true|false] [out=DIR]`")
    p_ctx.add_argument("args", nargs="+")
    p_cb = sub.add_parser("commbench", help="bus bandwidth per collective and message size on this machine's "
                                            "backend: `commbench launcher.nproc=N [sizes=[...]] [out=DIR]`")
    p_cb.add_argument("args", nargs="*")
    p_adv = sub.add_parser("advise", help="which framework and layout for this model on N devices: "
                                          "`advise model=M devices=N [budget_runs=K] ...`, `advise resume DIR`")
    p_adv.add_argument("args", nargs="+")
    p_sweep = sub.add_parser("sweep", help="a sweep: `sweep [opts] overrides`, `sweep status DIR`, `sweep resume DIR`")
    p_sweep.add_argument("--backend", choices=("local", "slurm"), default="local")
    p_sweep.add_argument("--dir", help="sweep directory (default outputs/sweeps/<time>)")
    p_sweep.add_argument("--repeats", type=int, default=1, help="repeats per cell (run.repeat=0..N-1)")
    p_sweep.add_argument("--throttle", type=int, default=None, help="Slurm: at most N array tasks at once")
    p_sweep.add_argument("--cpus-per-rank", type=int, default=1, help="Slurm: CPUs reserved per rank")
    p_sweep.add_argument("--job-name", default="ddlbench")
    p_sweep.add_argument("overrides", nargs="*")
    sub.add_parser("cluster", help="an emulated multi-node cluster on this machine (root): `cluster up [nodes=2] "
                                   "[link=1gbit]`, `cluster status`, `cluster exec -- CMD`, `cluster down`")
    argv = sys.argv[1:] if argv is None else list(argv)
    signals.install()     # SIGTERM/SIGHUP/SIGINT unwind the command: what it started is stopped on the way
    quiet.install()       # library chatter that does not concern the run: kept in the run's directory
    try:
        return _dispatch(parser, argv)
    except (KeyboardInterrupt, signals.Stopped) as exc:
        print(f"bench: stopped by {signals.name_of(exc)}", file=sys.stderr, flush=True)
        return signals.exit_code(exc)


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    if argv[:1] == ["cluster"]:     # its own parser: `exec -- CMD` keeps everything after -- as it is
        try:
            from ddlbench.cluster.command import run as cluster
            return cluster(argv[1:])
        except ConfigError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    args = parser.parse_args(argv)
    try:
        if os.environ.get(device_task.ENV):   # a task srun started in a cluster with device namespaces
            device_task.enter()
        if args.command == "sweep":
            from ddlbench.sweep import commands
            if args.overrides[:1] in (["status"], ["resume"]):
                if len(args.overrides) != 2:
                    raise ConfigError(f"usage: bench sweep {args.overrides[0]} SWEEP_DIR")
                fn = commands.show_status if args.overrides[0] == "status" else commands.resume
                return fn(Path(args.overrides[1]))
            return commands.start(args)
        if args.command == "run":
            return cmd_multirun(args.overrides) if args.multirun else cmd_run(args.overrides)
        if args.command == "project":
            from ddlbench.project.command import run as project
            return project(args.args)
        if args.command == "context":
            from ddlbench.project.context import run as context
            return context(args.args)
        if args.command == "advise":
            from ddlbench.advise.command import run as advise
            return advise(args.args)
        if args.command == "commbench":
            from ddlbench.commbench.command import run as commbench
            return commbench(args.args)
        if args.command == "report":
            return cmd_report(args.paths, args.out, args.wandb, args.replace)
        return cmd_table(args.paths)
    except ConfigError as exc:
        print(f"bench: config error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def entry() -> int:
    """Console entry: a closed stdout (`bench ... | head`) ends quietly. The process ends with
    os._exit once its output is flushed: finalising torch and transformers' modules takes ~1 s
    and nothing is left to do (results are written and fsynced, sinks finished, children reaped)."""
    import logging
    import os

    try:
        code = main()
    except BrokenPipeError:
        sys.stderr.close()
        code = 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
