"""Rules the suite keeps about itself, checked on its own source (AST), so that a later test
cannot quietly break them:

1. No wall-clock assertion: an `assert` never bounds a duration (a difference of
   time.monotonic/time.time/perf_counter readings, or a name assigned one) from above. A busy CI
   machine makes such tests flaky; times belong in benchmarks/.
2. Every inner bound (a subprocess `timeout=`, `timeout N cmd`, a polling helper's timeout) is
   below the pytest timeout of the test that uses it: otherwise pytest kills the test first,
   and the cleanup that the inner bound guards (stop the run, kill its ranks) never happens.
3. A timeout bounds one process, never a group of runs: conftest's commands re-arm the test's
   alarm to their own bound (checked here on the alarm itself), all of it scaled by one factor.
4. No assertion on how many rounds, repeats or retries noise caused: an `assert` never compares
   something named `rounds` with a literal count or list.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PYPROJECT = TESTS.parent / "pyproject.toml"
CLOCKS = {"monotonic", "time", "perf_counter"}
POLL_HELPERS = {"wait_for": 1, "wait_done": 1, "wait_until_training": 2}   # name -> index of the bound


def default_timeout() -> float:
    m = re.search(r"--timeout[= ](\d+)", PYPROJECT.read_text())
    assert m, "pyproject's pytest addopts must set --timeout"
    return float(m.group(1))


def _timeout_mark(node: ast.FunctionDef) -> float | None:
    for dec in node.decorator_list:
        if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "timeout"
                and dec.args and isinstance(dec.args[0], ast.Constant)):
            return float(dec.args[0].value)
    return None


def inner_bounds(fn: ast.FunctionDef) -> list[tuple[int, float]]:
    """(line, seconds) of every constant bound inside `fn`."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("timeout", "timeout_s") and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, (int, float)):
                    out.append((node.lineno, float(kw.value.value)))
            name = node.func.id if isinstance(node.func, ast.Name) else None
            i = POLL_HELPERS.get(name or "")
            if i is not None and len(node.args) > i and isinstance(node.args[i], ast.Constant):
                out.append((node.lineno, float(node.args[i].value)))
        if isinstance(node, ast.List) and len(node.elts) > 1 and all(isinstance(e, ast.Constant) for e in node.elts[:2]) \
                and node.elts[0].value == "timeout" and str(node.elts[1].value).isdigit():
            out.append((node.lineno, float(node.elts[1].value)))
    return sorted(out)


def _is_clock(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCKS


def wall_clock_asserts(fn: ast.FunctionDef) -> list[int]:
    """Lines of asserts that bound a measured duration from above: a clock reading minus a start,
    or a name holding such a difference, compared as less than a bound. A polling deadline
    (a clock reading compared with a deadline moment) bounds a hang and is allowed."""
    moments: set[str] = set()      # t0 = time.monotonic(); deadline = time.monotonic() + 60
    durations: set[str] = set()    # elapsed = time.monotonic() - t0

    def is_duration(expr) -> bool:
        return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and any(
            _is_clock(o) or isinstance(o, ast.Name) and o.id in moments for o in (n.left, n.right))
            for n in ast.walk(expr)) or any(isinstance(n, ast.Name) and n.id in durations for n in ast.walk(expr))

    for node in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if is_duration(node.value):
            durations |= names
        elif any(_is_clock(c) for c in ast.walk(node.value)):
            moments |= names
    return sorted({node.lineno for node in ast.walk(fn) if isinstance(node, ast.Assert)
                   for cmp in ast.walk(node.test) if isinstance(cmp, ast.Compare)
                   if any(isinstance(op, (ast.Lt, ast.LtE)) for op in cmp.ops) and is_duration(cmp.left)})


NOISY_COUNTS = {"rounds"}


def noise_count_asserts(fn: ast.FunctionDef) -> list[int]:
    """Lines of asserts that pin an adaptive loop's round count: `x == [literal list]` or
    `len(x) == N` where x mentions `rounds` (a name, attribute or string key)."""
    def mentions(expr) -> bool:
        return any(isinstance(n, ast.Name) and n.id in NOISY_COUNTS or isinstance(n, ast.Attribute)
                   and n.attr in NOISY_COUNTS or isinstance(n, ast.Constant) and n.value in NOISY_COUNTS
                   for n in ast.walk(expr))

    def literal(expr) -> bool:
        return isinstance(expr, (ast.List, ast.Tuple)) or isinstance(expr, ast.Constant) and isinstance(expr.value, int)

    out = set()
    for node in (n for n in ast.walk(fn) if isinstance(n, ast.Assert)):
        for cmp in (c for c in ast.walk(node.test) if isinstance(c, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            if any(isinstance(op, ast.Eq) for op in cmp.ops) and any(literal(x) for x in sides) \
                    and any(mentions(x) for x in sides if not literal(x)):
                out.add(node.lineno)
    return sorted(out)


def _functions(path: Path):
    tree = ast.parse(path.read_text())
    module_mark = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for call in (n for n in ast.walk(node.value) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "timeout" and call.args:
                    module_mark = float(call.args[0].value)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node, _timeout_mark(node) or module_mark


FILES = sorted(TESTS.glob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_wall_clock_assertions(path):
    bad = [f"{path.name}:{line}" for fn, _ in _functions(path) for line in wall_clock_asserts(fn)]
    assert not bad, f"asserts on measured time (flaky on a busy machine; use benchmarks/): {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_inner_bounds_are_below_the_pytest_timeout(path):
    default = default_timeout()
    bad = [f"{path.name}:{line} bound {s:g} s >= pytest timeout {(mark or default):g} s"
           for fn, mark in _functions(path) for line, s in inner_bounds(fn) if s >= (mark or default)]
    assert not bad, bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_assertion_counts_the_rounds_noise_caused(path):
    bad = [f"{path.name}:{line}" for fn, _ in _functions(path) for line in noise_count_asserts(fn)]
    assert not bad, f"asserts how many rounds a noisy measurement took (assert what holds on every path): {bad}"


@pytest.mark.timeout(40)
def test_a_command_rearms_the_tests_alarm_to_its_own_bound():
    """Rule 3 on the alarm itself: inside a command's bound the test's alarm is that bound plus the
    clean-up, whatever the test's own timeout; after it, the test's own timeout again."""
    import signal

    from conftest import CLEANUP_S, TIME_SCALE, Bounded, scaled
    assert scaled(10) == 10 * TIME_SCALE
    with Bounded(scaled(500)):
        assert signal.getitimer(signal.ITIMER_REAL)[0] > scaled(500) + CLEANUP_S - 5
    assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= scaled(40)


def test_the_rules_catch_what_they_guard():
    less = "<"   # the fixture's offending lines, spelled so that a grep of the suite does not hit them
    src = f'''
import subprocess, time
def test_a():
    t0 = time.monotonic()
    subprocess.run(["x"], timeout=400)
    took = time.monotonic() - t0
    assert took {less} 30
    assert time.monotonic() - t0 {less} 60
    subprocess.run(["timeout", "900", "srun"])
    wait_for(lambda: True, 500, "x")
'''
    fn = ast.parse(src).body[1]
    assert wall_clock_asserts(fn) == [7, 8]
    assert [s for _, s in inner_bounds(fn)] == [400.0, 900.0, 500.0]
    ok = ast.parse("def test_b(x):\n    assert x['timeout_s'] < 20\n    assert len(x) < 3\n"
                   "    deadline = time.monotonic() + 5\n    assert time.monotonic() < deadline\n").body[0]
    assert wall_clock_asserts(ok) == []
    counts = ast.parse("def test_c(state, adv):\n    assert [r['dir'] for r in state['rounds']] == ['measure', 'measure-2']\n"
                       "    assert len(adv.rounds) == 2\n    assert len(state['rounds']) <= 4\n"
                       "    assert state['rounds'][0]['dir'] == dirs[0]\n").body[0]
    assert noise_count_asserts(counts) == [2, 3]


def _clock_reads(src: str) -> list[int]:
    tree = ast.parse(src)
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in CLOCKS | {"perf_counter_ns", "monotonic_ns", "process_time"}
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "time"]


def test_adapters_read_no_clock():
    """The runner is the only timed loop (docs/design.md): an adapter that timed its own passes would
    report a number no one else measured the same way (the pipeline's busy probe now hands its
    passes to ddlbench/rank/runner.py)."""
    assert _clock_reads("import time\nt0 = time.perf_counter()\nx = time.monotonic() - t0\n") == [2, 3]
    found = [f"{p.name}:{line}" for p in sorted((REPO / "ddlbench" / "adapters").glob("*.py"))
             for line in _clock_reads(p.read_text())]
    assert found == []
