"""The adapter contract is written down: every member of an adapter that the harness reads
(the runner, the collector, the launchers, the sweep and advise) is declared on
bench.adapters.base.Adapter, so a new framework learns what to provide from one class."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from bench.adapters.base import Adapter, RankContext
from bench.config import plan_from_overrides

BENCH = Path(__file__).resolve().parents[1] / "bench"
NAMES = {"adapter", "adapter_cls"}   # how the harness names an adapter or its class


def modules():
    """(path relative to bench/, every AST node) of each module of bench/."""
    for path in BENCH.rglob("*.py"):
        yield path.relative_to(BENCH), ast.walk(ast.parse(path.read_text()))


def read_members() -> dict[str, set[str]]:
    """{attribute: {file}} for every `adapter.X` / `adapter_cls.X` / `plan.adapter_cls.X` outside
    bench/adapters."""
    found: dict[str, set[str]] = {}
    for path, nodes in modules():
        if "adapters" in path.parts:
            continue
        for node in nodes:
            if not isinstance(node, ast.Attribute):
                continue
            v = node.value
            name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None
            if name in NAMES:
                found.setdefault(node.attr, set()).add(str(path))
    return found


def test_every_adapter_member_the_harness_reads_is_declared_on_the_base():
    plan = plan_from_overrides(["framework=ddp", "launcher.nproc=1"])
    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", precision="fp32")
    declared = Adapter(plan.options, ctx, plan.dims)
    members = read_members()
    assert {"train_step", "setup", "per_node", "dp_rank", "params", "busy_probe", "launch"} <= set(members), members
    missing = {m: files for m, files in members.items() if not hasattr(declared, m)}
    assert not missing, f"read from adapters but not declared on bench.adapters.base.Adapter: {missing}"


def test_nothing_below_the_command_line_imports_it():
    """argparse stays in bench/cli.py: a module it calls that imported it back (the sweep's cells
    did, through bench.cli.main) would make a circle. Runs go through bench.run_entry."""
    importers = []
    for path, nodes in modules():
        if str(path) == "cli.py":
            continue
        for node in nodes:
            if (isinstance(node, ast.ImportFrom) and node.module == "bench.cli"
                    or isinstance(node, ast.Import) and any(a.name == "bench.cli" for a in node.names)):
                importers.append(str(path))
    assert not importers, f"import bench.cli from below it: {importers}"
