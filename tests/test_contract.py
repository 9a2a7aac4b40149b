"""The adapter contract is written down: every member of a strategy or a variant that the
harness reads (the runner, the collector, the launchers, the sweep and advise) is declared on
ddlbench.adapters.base.Strategy (or one of its optional interfaces) or on
ddlbench.adapters.variant.Variant, so a new framework learns what to provide from two small classes."""
from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from importgraph import cycles, import_graph

from ddlbench.adapters import base
from ddlbench.adapters.variant import Variant

BENCH = Path(__file__).resolve().parents[1] / "ddlbench"
INTERFACES = (base.Strategy, base.Periodic, base.CountsOwnCollectives, base.ModelParallel)


def modules():
    """(path relative to ddlbench/, every AST node) of each module of ddlbench/."""
    for path in BENCH.rglob("*.py"):
        yield path.relative_to(BENCH), ast.walk(ast.parse(path.read_text()))


def read_members(names: set[str]) -> dict[str, set[str]]:
    """{attribute: {file}} for every `X.attr` with X in `names` (a name, or an attribute
    `plan.variant`) outside ddlbench/adapters."""
    found: dict[str, set[str]] = {}
    for path, nodes in modules():
        if "adapters" in path.parts:
            continue
        for node in nodes:
            if not isinstance(node, ast.Attribute):
                continue
            v = node.value
            name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None
            if name in names:
                found.setdefault(node.attr, set()).add(str(path))
    return found


def declared(cls) -> set[str]:
    """Class members and the attributes its __init__ assigns."""
    names = {n for n in vars(cls) if not n.startswith("__")} | {"__init__"}
    init = cls.__dict__.get("__init__")
    if init is not None:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(init)))
        names |= {t.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                  for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names


def test_every_member_the_harness_reads_is_declared():
    strategy_reads = read_members({"strategy"})
    assert {"train_step", "setup", "node_groups", "dp_rank", "params", "precision"} <= set(strategy_reads)
    on_strategy = set().union(*(declared(c) for c in INTERFACES))
    missing = {m: f for m, f in strategy_reads.items() if m not in on_strategy}
    assert not missing, f"read from strategies but declared on no interface of ddlbench/adapters/base.py: {missing}"
    variant_reads = read_members({"variant"})
    assert {"cost_model", "unsupported_reason", "starter", "taxonomy", "strategy_class"} <= set(variant_reads)
    missing = {m: f for m, f in variant_reads.items() if m not in declared(Variant)}
    assert not missing, f"read from variants but not declared on ddlbench.adapters.variant.Variant: {missing}"


@pytest.mark.parametrize("cls", [Variant, *INTERFACES])
def test_each_half_of_the_contract_is_small(cls):
    """torchtitan's TrainSpec has ~11 fields; the old one-class contract had ~45 members."""
    # 21: `abilities` replaced five name lists (what compiles, takes float8, traces, settles `auto`, is priced how)
    assert len(declared(cls)) <= 21, sorted(declared(cls))


def test_every_framework_file_holds_a_variant_and_its_strategy():
    """Each conf/framework names a Variant whose strategy is in the same file and is a Strategy."""
    from ddlbench.planning.config import CONF_DIR, compose_raw, group_options, load_variant_class
    for name in group_options("framework"):
        path = compose_raw([f"framework={name}"])["framework"]["adapter"]
        cls = load_variant_class(path)
        assert cls.strategy.partition(":")[0] == path.partition(":")[0], (name, cls.strategy)
        assert issubclass(cls(cls.Options()).strategy_class(), base.Strategy), name
    assert CONF_DIR.is_dir()


def variant_classes() -> set[type]:
    """The Variant class of every conf/framework."""
    from ddlbench.planning.config import compose_raw, group_options, load_variant_class
    return {load_variant_class(compose_raw([f"framework={n}"])["framework"]["adapter"]) for n in group_options("framework")}


def test_what_a_variant_says_it_applies_its_file_applies():
    """A variant's abilities (compiles, float8) are the one statement of what its strategy wires
    (validation refuses the rest); each matches its file: expert parallelism compiled its blocks while
    a name list elsewhere refused run.compile for it."""
    import inspect
    classes = variant_classes()
    for cls in classes:
        src = inspect.getsource(sys.modules[cls.__module__])
        own = [c(c.Options()).abilities() for c in classes if c.__module__ == cls.__module__]
        assert any(a.compiles for a in own) == ("apply_compile(" in src or ".compile()" in src), cls.__name__
        assert any(a.float8 for a in own) == ("apply_float8(" in src), cls.__name__


def test_a_framework_own_launcher_is_named_only_by_it():
    """The launchers ask the variant's starter; no launcher branches on a framework's name."""
    where = {str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py") if "horovodrun" in p.read_text()}
    # Horovod's starter and what only it uses (its Slurm slots, its worker, the rank server and its client)
    assert where <= {"adapters/horovod.py", "launch/horovod.py", "launch/hvd_slurm.py", "launch/hvd_worker.py",
                     "launch/rankserver.py", "launch/hvd_shim.py"}, where


def test_no_module_is_longer_than_400_lines():
    long = {str(p.relative_to(BENCH)): n for p in BENCH.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


PURE = """
import json, sys
from ddlbench.planning.config import plan_from_overrides, group_options
from ddlbench.errors import ConfigError
for name in group_options("framework"):
    try:
        plan = plan_from_overrides([f"framework={name}", "launcher.nproc=2"])
    except ConfigError as exc:
        if "needs a Mixture-of-Experts" in str(exc):   # expert parallelism (tp=2 takes 4 ranks)
            plan = plan_from_overrides([f"framework={name}", "launcher.nproc=4", "model=moe_tiny"])
        elif "context parallelism" in str(exc):       # ring attention: a Llama-like model, causal SDPA
            plan = plan_from_overrides([f"framework={name}", "launcher.nproc=2", "model=llama_tiny",
                                        "model.attention=sdpa_causal"])
        else:                                         # sequence parallelism: a Llama-like model, SDPA
            assert "sequence parallelism" in str(exc) or "Ulysses" in str(exc), exc
            plan = plan_from_overrides([f"framework={name}", "launcher.nproc=2", "model=llama_tiny",
                                        "model.attention=sdpa"])
    plan.variant.taxonomy(); plan.variant.advise_options(2); plan.variant.unsupported_reason(plan.cfg, "cpu")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("deepspeed", "horovod", "fairscale"))))
"""


def test_questions_about_a_variant_import_no_framework():
    """Validation and advise's questions (taxonomy, option edits, unsupported reasons) of every
    framework variant import neither DeepSpeed nor Horovod nor FairScale (only a rank does)."""
    out = subprocess.run([sys.executable, "-c", PURE], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_nothing_below_the_command_line_imports_it():
    """argparse stays in ddlbench/cli.py: a module it calls that imported it back (the sweep's cells
    did, through ddlbench.cli.main) would make a circle. Runs go through ddlbench.launch.run_entry."""
    importers = []
    for path, nodes in modules():
        if str(path) == "cli.py":
            continue
        for node in nodes:
            if (isinstance(node, ast.ImportFrom) and node.module == "ddlbench.cli"
                    or isinstance(node, ast.Import) and any(a.name == "ddlbench.cli" for a in node.names)):
                importers.append(str(path))
    assert not importers, f"import ddlbench.cli from below it: {importers}"


def test_no_import_circles():
    """No two modules of ddlbench/ or ddlbench/models/ import each other, directly or round a loop (the
    launch agent and its ranks shared failure rules; the model factory and the models it builds
    imported each other: ddlbench/launch/failures.py and ddlbench/models/registry.py now hold them)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]   # the detector
    graph = import_graph()
    assert "ddlbench.models.registry" in graph["ddlbench.models"] and "ddlbench.launch.failures" in graph["ddlbench.launch.worker"]
    assert not cycles(graph), cycles(graph)


def test_only_the_command_line_reaches_up_into_advise():
    """The predictor (ddlbench/estimate/: profile, memory, step time, collectives) sits below
    `bench advise`, `bench project` and run.micro_batch=auto alike: no module outside
    ddlbench/advise/ imports advise but the command line that dispatches to it (planning reached
    up into advise for the memory estimator before: config -> microbatch -> advise)."""
    graph = import_graph()
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() if not m.startswith("ddlbench.advise")
                    and m != "ddlbench.cli" for d in deps if d.startswith("ddlbench.advise"))
    assert not upward, upward
    assert {"ddlbench.estimate.memory", "ddlbench.estimate.profile"} <= graph["ddlbench.planning.microbatch"] | {
        d for m in graph["ddlbench.planning.microbatch"] for d in graph.get(m, ())}


RUN_FILES = ("result.json", "config.json", "config.yaml", "metrics.jsonl", "events.jsonl", "failure.json",
             "agent.log", "stderr.log")
RUN_DIRS = ("errors", "partial", "stacks", "logs")


def test_the_run_directory_is_named_in_one_module():
    """Every file name of a run directory is spelt in ddlbench/record/rundir.py and nowhere else in ddlbench/
    (docstrings aside): `X / "result.json"` or a constant of its own elsewhere was how the
    directory's layout drifted apart (four places named the directory, ten its files)."""
    from ddlbench.record.rundir import RunDir, of_cell
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
