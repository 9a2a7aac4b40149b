"""`bench` command line. Bad input: one line on stderr, exit 2, no traceback.

  bench run [overrides...]        one measured run (Hydra overrides: framework=ddp model=... )
  bench table DIR...              a short table of the results under DIRs
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

from bench.errors import ConfigError

EXIT_BAD_INPUT = 2
EXIT_RUN_NOT_OK = 1


def _run_dir(plan) -> Path:
    if plan.cfg.run.dir:
        return Path(plan.cfg.run.dir)
    stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    name = f"{stamp}_{plan.cfg.framework.name}-{plan.cfg.framework.variant}_{plan.cfg.model.name}_n{plan.dims.world_size}"
    base = Path("outputs") / "runs" / name
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}_{i}")
    return path


def cmd_run(overrides: list[str]) -> int:
    from bench.config import plan_from_overrides

    plan = plan_from_overrides(overrides)
    if plan.cfg.run.dry_run:
        import json
        print(json.dumps({"parallel": plan.dims.as_dict(), "framework": plan.cfg.framework.model_dump(),
                          "model": plan.cfg.model.model_dump()}, indent=2))
        print("dry run: config is valid; nothing launched")
        return 0
    run_dir = _run_dir(plan)
    if (run_dir / "result.json").exists():
        raise ConfigError(f"run.dir {run_dir} already holds a result.json; choose another run.dir")
    from bench.launch.local import run_local
    from bench.sinks import log_to_sinks
    from bench.table import render, rows

    record = run_local(plan, run_dir)
    log_to_sinks(plan, run_dir, record)
    print(render(rows([record])))
    print(f"result: {run_dir / 'result.json'}")
    return 0 if record["status"] == "ok" else EXIT_RUN_NOT_OK


def cmd_table(paths: list[str]) -> int:
    from bench.table import table_for
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such path: {', '.join(missing)}")
    print(table_for(paths))
    print(f"results under: {' '.join(paths)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description="Benchmark distributed training frameworks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="one measured run; args are Hydra overrides (key=value)")
    p_run.add_argument("overrides", nargs="*")
    p_table = sub.add_parser("table", help="short table of results under the given dirs")
    p_table.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args.overrides)
        return cmd_table(args.paths)
    except ConfigError as exc:
        print(f"bench: config error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
