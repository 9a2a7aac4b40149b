"""The adapter contract is written down: every member of an adapter that the harness reads
(the runner, the collector, the launchers, the sweep and advise) is declared on
ddlbench.adapters.base.Adapter, so a new framework learns what to provide from one class."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from ddlbench.adapters.base import Adapter, RankContext
from ddlbench.config import plan_from_overrides

BENCH = Path(__file__).resolve().parents[1] / "ddlbench"
NAMES = {"adapter", "adapter_cls"}   # how the harness names an adapter or its class


def modules():
    """(path relative to ddlbench/, every AST node) of each module of ddlbench/."""
    for path in BENCH.rglob("*.py"):
        yield path.relative_to(BENCH), ast.walk(ast.parse(path.read_text()))


def read_members() -> dict[str, set[str]]:
    """{attribute: {file}} for every `adapter.X` / `adapter_cls.X` / `plan.adapter_cls.X` outside
    ddlbench/adapters."""
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
    assert {"train_step", "setup", "node_groups", "dp_rank", "params", "busy_probe", "launch"} <= set(members), members
    missing = {m: files for m, files in members.items() if not hasattr(declared, m)}
    assert not missing, f"read from adapters but not declared on ddlbench.adapters.base.Adapter: {missing}"


def test_nothing_below_the_command_line_imports_it():
    """argparse stays in ddlbench/cli.py: a module it calls that imported it back (the sweep's cells
    did, through ddlbench.cli.main) would make a circle. Runs go through ddlbench.run_entry."""
    importers = []
    for path, nodes in modules():
        if str(path) == "cli.py":
            continue
        for node in nodes:
            if (isinstance(node, ast.ImportFrom) and node.module == "ddlbench.cli"
                    or isinstance(node, ast.Import) and any(a.name == "ddlbench.cli" for a in node.names)):
                importers.append(str(path))
    assert not importers, f"import ddlbench.cli from below it: {importers}"


def import_graph() -> dict[str, set[str]]:
    """{module: modules of ddlbench/ and ddlbench/models/ it imports}, counting imports inside functions too
    (a lazy import still ties two modules into one)."""
    root = BENCH.parent
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in BENCH.rglob("*.py")}
    graph = {}
    for mod, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):   # not its own package
                    deps.add(name)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    """No two modules of ddlbench/ or ddlbench/models/ import each other, directly or round a loop (the
    launch agent and its ranks shared failure rules; the model factory and the models it builds
    imported each other: ddlbench/launch/failures.py and ddlbench/models/registry.py now hold them)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]   # the detector
    graph = import_graph()
    assert "ddlbench.models.registry" in graph["ddlbench.models"] and "ddlbench.launch.failures" in graph["ddlbench.launch.worker"]
    assert not cycles(graph), cycles(graph)


RUN_FILES = ("result.json", "config.json", "config.yaml", "metrics.jsonl", "events.jsonl", "failure.json",
             "agent.log", "stderr.log")
RUN_DIRS = ("errors", "partial", "stacks", "logs")


def test_the_run_directory_is_named_in_one_module():
    """Every file name of a run directory is spelt in ddlbench/rundir.py and nowhere else in ddlbench/
    (docstrings aside): `X / "result.json"` or a constant of its own elsewhere was how the
    directory's layout drifted apart (four places named the directory, ten its files)."""
    from ddlbench.rundir import RunDir, of_cell
    from ddlbench.sweep.cells import Cell

    rd = RunDir("/r")
    assert (rd.result, rd.metrics, rd.rank_partial(1), rd.rank_error(0, "done")) == (
        Path("/r/result.json"), Path("/r/metrics.jsonl"), Path("/r/partial/rank1.json"), Path("/r/errors/rank0.done"))
    cell = Cell(index=0, id="abc", overrides=[], repeat=0)
    assert of_cell("/s", cell).path == Path("/s/abc")
    assert of_cell("/s", Cell(index=0, id="abc", overrides=[], repeat=0, name="000_ddp")).path == Path("/s/000_ddp")
    spelt = []
    for path in BENCH.rglob("*.py"):
        if path.name == "rundir.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr)}
        joined = {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
                continue
            if node.value in RUN_FILES or (node.value in RUN_DIRS and id(node) in joined):
                spelt.append(f"{path.relative_to(BENCH)}:{node.lineno} {node.value!r}")
    assert not spelt, spelt
