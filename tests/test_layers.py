"""The floor plan of ddlbench/: rooms in layers, read in the order a run flows, and every import —
inside functions and under TYPE_CHECKING too — checked against that order: a module imports its own
room or a room below it, never one above. docs/design.md §1 lists the same rooms in the same order.

Before this test the package root held 37 loose modules and 11 imports ran back up (the predictor in
estimate/ held commands and imported the planner and a launcher; launch/ and the runner imported each
other); 47% of imports are made inside functions, which is how they got in unnoticed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from importgraph import BENCH, import_graph

# top first; a room may import itself and anything after it
LAYERS = (
    "cli",          # `bench` and its sub-commands: argparse lives only here
    "advise",       # `bench advise`
    "report",       # `bench report`: tables, plots, HTML/Markdown, W&B report
    "project",      # `bench project`, `bench context`, the fake-group tracing, pieces timed here
    "commbench",    # `bench commbench`
    "sweep",        # sweeps: cells, manifest, local and Slurm back ends
    "launch",       # how ranks start, and `bench run` below the command line
    "rank",         # the timed loop and the record rank 0 builds, with their services
    "planning",     # Hydra compose -> a validated Plan; micro_batch=auto
    "estimate",     # the predictor, pure
    "adapters",     # one file per framework: its Variant and Strategy
    "cluster",      # `bench cluster`: emulated nodes
    "settings",     # schema, parallel dimensions, dataset checks, key=value
    "machine",      # device, GPUs, NVML, peaks and probes, the environment
    "lifecycle",    # ownership, signals, quiet start, events, how a stopped run still leaves a record
    "sinks",        # W&B
    "network",      # the alpha-beta model only
    "models",       # model families, presets, data
    "comm",         # what a rank measures of its collectives; the node layout
    "record",       # result.json, the run directory, readers, the terminal table
    "metrics",      # pure arithmetic
    "errors",       # the package's errors
)
ROOT_MODULES = {"__init__.py", "cli.py", "errors.py"}


def room(module: str) -> str | None:
    """ddlbench.X.* -> X; the package's own __init__ -> None (it imports nothing of ours)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import from a room to a room above it, as 'module -> module (room -> room)'."""
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = room(mod), room(dep)
            if a and b and layers.index(b) < layers.index(a):
                out.append(f"{mod} -> {dep} ({a} -> {b})")
    return out


def test_no_import_runs_up_the_layers():
    graph = import_graph()
    assert {room(m) for m in graph} - {None} == set(LAYERS), "every room is listed, every listed room exists"
    assert upward(graph) == []
    # the lazy imports are in the graph: the launcher's starter imports the runner inside a function
    assert "ddlbench.rank.runner" in graph["ddlbench.launch.starters"]


def test_the_package_root_holds_the_command_line_and_errors_only():
    loose = sorted(p.name for p in BENCH.glob("*.py"))
    assert set(loose) == ROOT_MODULES, loose
    assert all((BENCH / r / "__init__.py").is_file() for r in LAYERS if r not in ("cli", "errors"))


def test_every_import_is_absolute_so_the_graph_sees_it():
    relative = [f"{p.relative_to(BENCH)}:{n.lineno}" for p in BENCH.rglob("*.py")
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == []


def test_an_import_added_up_the_layers_fails_the_check(tmp_path):
    """Tried: the checker on a copy of two rooms, clean, then with one lazy import from the predictor
    up into planning added inside a function (how estimate/ reached config before)."""
    pkg = tmp_path / "ddlbench"
    for rel in ("__init__.py", "estimate/__init__.py", "planning/__init__.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("")
    (pkg / "planning" / "config.py").write_text("from ddlbench.estimate import memory\n")
    (pkg / "estimate" / "memory.py").write_text("def f():\n    return 1\n")
    assert upward(import_graph(pkg)) == []
    (pkg / "estimate" / "memory.py").write_text("def f():\n    from ddlbench.planning.config import validate\n")
    assert upward(import_graph(pkg)) == [
        "ddlbench.estimate.memory -> ddlbench.planning.config (estimate -> planning)"]


def design_floor_plan() -> dict[str, set[str]]:
    """{room: its members} from docs/design.md §1's `ddlbench/` block: a room is a line `  name/` or
    `  name.py`; its members are the lines below it made only of file names."""
    text = (BENCH.parent / "docs" / "design.md").read_text()
    section = text.split("## 1.", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```")[1::2] if b.lstrip().startswith("ddlbench/"))
    rooms: dict[str, set[str]] = {}
    for line in block.strip().splitlines()[1:]:
        head = re.match(r"^  ([a-z_]+)(/|\.py)\s", line + " ")
        if head:
            current = rooms.setdefault(head.group(1), set())
        elif line.split() and all(re.fullmatch(r"[a-z_0-9]+(\.py|/)", w) for w in line.split()):
            current |= set(line.split())
    return rooms


def test_design_names_each_room_and_member_in_the_layers_order():
    """docs/design.md §1 names every room once, top first, in this test's order, and each room's
    members exactly as the tree holds them: none missing, none gone."""
    plan = design_floor_plan()
    assert list(plan) == list(LAYERS)
    for name, members in plan.items():
        if name in ("cli", "errors"):
            assert not members and (BENCH / f"{name}.py").is_file()
            continue
        here = {p.name + ("/" if p.is_dir() else "") for p in (BENCH / name).iterdir()
                if p.name not in ("__init__.py", "__pycache__")}
        assert members == here, (name, "in design only:", sorted(members - here), "in the tree only:", sorted(here - members))


@pytest.mark.parametrize("name", LAYERS)
def test_each_room_says_what_it_holds(name):
    """Each room opens with a docstring of its own (a room's __init__, or the root module)."""
    path = BENCH / (f"{name}.py" if name in ("cli", "errors") else f"{name}/__init__.py")
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc) > 40 and doc != "(room)", path


# collections of framework names that are not framework knowledge, and why
NAME_LISTS_ALLOWED = {
    "PACKAGES": "pip package names recorded with each result (ddlbench/machine/envinfo.py)",
    "DEFAULT_FRAMEWORKS": "conf/framework names: bench advise's default candidates, a choice the user can change",
}


def _variant_names() -> set[str]:
    from test_contract import variant_classes
    return {c.name for c in variant_classes()}


def _family_names() -> set[str]:
    from ddlbench.models.family import names
    return set(names())


def _name_branches(names: set[str], outside: str, about: str | None = None, package: Path = BENCH) -> list[str]:
    """Where a module outside `outside` compares with one of `names` (==, !=, in, a startswith) or
    keeps a collection of two or more of them; with `about`, only comparisons whose text names it."""
    found = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        if rel.parts[0] == outside:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            consts = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            hit = consts & names
            if not hit:
                continue
            text = ast.unparse(node)
            if isinstance(node, ast.Compare) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                                 and node.func.attr == "startswith"):
                if about is None or about in text:
                    found.append(f"{rel}:{node.lineno}: {text[:90]}")
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.Dict)) \
                    and len(hit) >= 2 and not any(isinstance(t, ast.Name) and t.id in NAME_LISTS_ALLOWED for t in node.targets):
                found.append(f"{rel}:{node.lineno}: {text[:90]}")
    return sorted(set(found))


def test_no_framework_name_is_branched_on_outside_the_adapters():
    """What a framework does is read from its Variant (its abilities(): compiles, float8, builds_on_meta,
    own_collectives, fake_group, settles, step; its hooks); the predictor
    branched 12 times on framework names and three name tables kept the rest, and drifted."""
    assert _name_branches(_variant_names(), "adapters") == []


def test_no_model_family_is_named_outside_the_models():
    """What a family allows is on its Family (ddlbench/models/family.py: sequence_split, linear_layers, ...)."""
    assert _name_branches(_family_names(), "models", about="famil") == []


def test_the_name_checks_find_a_branch(tmp_path):
    """Tried: the check finds the predictor's old branches, and a name table, and leaves the adapters be."""
    (tmp_path / "estimate").mkdir()
    (tmp_path / "adapters").mkdir()
    (tmp_path / "estimate" / "scale.py").write_text(
        'SUPPORTED = ("ddp", "fsdp2")\n\n\ndef f(fw):\n    return fw in ("ddp", "deepspeed") or fw.startswith("deepspeed")\n')
    (tmp_path / "adapters" / "ddp.py").write_text('def f(fw):\n    return fw == "ddp"\n')
    assert _name_branches(_variant_names(), "adapters", package=tmp_path) == [
        "estimate/scale.py:1: SUPPORTED = ('ddp', 'fsdp2')",
        "estimate/scale.py:5: fw in ('ddp', 'deepspeed')",
        "estimate/scale.py:5: fw.startswith('deepspeed')"]
