"""The GPU plan (benchmarks/gpu_plan.py): every cell of every step is a valid configuration, each
step's worst case fits one device call with margin, the first lease holds what never ran on a GPU,
a cell's kill leaves its record time to be written, records are kept as each cell ends, and
gpu_matrix's --plan stands for the step's arguments."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_matrix  # noqa: E402
import gpu_plan  # noqa: E402


def test_the_plan_dry_run_validates_every_cell_here():
    out = subprocess.run([sys.executable, "benchmarks/gpu_plan.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    cells = sum(len(s.cells) for s in gpu_plan.STEPS.values())
    assert out.stdout.count("\n  ok ") == cells and "INVALID" not in out.stdout
    for name, step in gpu_plan.STEPS.items():
        assert (f"timeout_s={gpu_plan.worst_case_s(step):.0f}, command='bash scripts/device_gpu_matrix.sh {name} "
                f"--plan {name}'") in out.stdout
    assert "lease 1: steps K, P (worst case 840 s of 900, start included)" in out.stdout


def test_each_steps_worst_case_fits_one_call_with_margin():
    assert sorted(gpu_plan.ORDER) == sorted(gpu_plan.STEPS)
    for name, step in gpu_plan.STEPS.items():
        assert step.cells or step.project, name
        assert gpu_plan.worst_case_s(step) <= gpu_plan.CALL_LIMIT_S - gpu_plan.CALL_MARGIN_S, name


def test_worst_case_by_hand():
    # step P: install 60 + probes 30 + no cells (deadline 0, no kill) + the projection's 200 s = 290
    assert gpu_plan.worst_case_s(gpu_plan.STEPS["P"]) == 60 + 30 + 200
    # step A: deadline 60, cells at the step's 120 s (+30), two gpt2_small reference comparisons of 2 repeats,
    # each repeat a reference and a runner run of 25 s
    assert gpu_plan.worst_case_s(gpu_plan.STEPS["A"]) == 60 + 30 + 60 + 150 + 2 * (2 * 2 * 25)


def test_the_leases_hold_first_what_never_ran_on_a_gpu():
    """The checkpoints (never run on a GPU) and the pieces calibration's framework step (fixed since its
    out-of-memory) in the next lease, the offload variants in the one after; every lease within the
    device time a session has, the machine's start included."""
    plan = gpu_plan.leases()
    assert plan[:2] == [["K", "P"], ["O"]] and [s for lease in plan for s in lease] == list(gpu_plan.ORDER)
    for lease in plan:
        assert gpu_plan.START_S + sum(gpu_plan.worst_case_s(gpu_plan.STEPS[s]) for s in lease) <= gpu_plan.LEASE_S
    # packing by hand: steps of 500 and 300 s share a lease of 900 (100 s to start); a third of 300 s does not
    steps = {"x": gpu_plan.Step("x", ("ddp gpt2_tiny fp32",), deadline_s=500 - 60 - 30 - 150),
             "y": gpu_plan.Step("y", ("ddp gpt2_tiny fp32",), deadline_s=300 - 60 - 30 - 150),
             "z": gpu_plan.Step("z", ("ddp gpt2_tiny fp32",), deadline_s=300 - 60 - 30 - 150)}
    assert [gpu_plan.worst_case_s(s) for s in steps.values()] == [500, 300, 300]
    assert gpu_plan.leases(("x", "y", "z"), steps) == [["x", "y"], ["z"]]


def test_a_cells_kill_leaves_time_for_its_record():
    """The harness kills a cell RECORD_GRACE_S after the cell's own run.timeout_s (the last given
    wins, as in Hydra), never before: a timed-out offload run wrote its record 12.6-13.6 s after it."""
    assert gpu_matrix.RECORD_GRACE_S >= 2 * 13.6
    assert gpu_matrix.cell_kill_s(["run.timeout_s=120", "x=1", "run.timeout_s=170"]) == 170 + gpu_matrix.RECORD_GRACE_S
    with pytest.raises(ValueError, match="run.timeout_s"):
        gpu_matrix.cell_kill_s(["x=1"])
    for step in gpu_plan.STEPS.values():
        common = [f"run.timeout_s={step.timeout_s}"]
        for c in step.cells:
            over = gpu_matrix.merged(common, tuple(gpu_plan.cell_overrides(c)))
            own = float([o for o in over if o.startswith("run.timeout_s=")][-1].split("=")[1])
            assert gpu_matrix.cell_kill_s(over) - own == gpu_matrix.RECORD_GRACE_S


def test_records_are_kept_as_each_cell_ends(tmp_path):
    """--keep: each record appended (whole lines, in the order the cells ended) and the rows so far
    replaced, so what a killed call leaves under $OUT is every record it finished."""
    prefix = tmp_path / "out" / "G"
    checks = {"cells": [{"status": "ok"}]}
    gpu_matrix.keep(prefix, checks, {"status": "ok", "run_id": "a"}, "cell-a")
    assert json.loads(Path(f"{prefix}.checks.json").read_text()) == checks
    checks["cells"].append({"status": "timeout"})
    gpu_matrix.keep(prefix, checks, {"status": "timeout", "run_id": "b"}, "cell-b")
    gpu_matrix.keep(prefix, checks)                      # rows only (a projection, the end)
    gpu_matrix.keep(None, checks, {"status": "ok"}, "nowhere")     # without --keep: nothing
    lines = [json.loads(line) for line in Path(f"{prefix}.records.jsonl").read_text().splitlines()]
    assert [(x["cell"], x["record"]["run_id"]) for x in lines] == [("cell-a", "a"), ("cell-b", "b")]
    assert len(json.loads(Path(f"{prefix}.checks.json").read_text())["cells"]) == 2
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["G.checks.json", "G.records.jsonl"]


def test_plan_expands_to_the_steps_arguments():
    assert gpu_matrix.expand_plan(["--out", "X", "--plan", "A"]) == ["--out", "X", *gpu_plan.STEPS["A"].matrix_args()]
    assert gpu_matrix.expand_plan(["--out", "X"]) == ["--out", "X"]
    a = gpu_plan.STEPS["A"].matrix_args()
    assert a.count("--overhead") == 2 and "cells,overhead" in a
    p = gpu_plan.STEPS["P"].matrix_args()
    assert p[p.index("--project-timeout") + 1] == "200" and p.count("--project") == 1 and "--cell" not in p
    assert p[p.index("--parts") + 1] == "report"     # no cells: gpu_matrix runs the projection alone


def test_settings_a_committed_record_lacks_are_listed():
    """A record from before run.gc existed ran under Python's collector: the plan says what a new
    figure runs under that the committed one did not; settings that are off by default change nothing."""
    recorded = {"warmup_steps": 3, "measure_steps": 20, "comm_profile": True}
    added = gpu_plan.settings_added_since(recorded)
    assert added["gc"] == "freeze" and added["comm_profile_repeats"] == 3
    assert "warmup_steps" not in added and "warmup_max_steps" not in added and "min_window_s" not in added
    # the newest committed GPU record (2026-11-30) ran under the frozen collector
    path, run = gpu_plan._latest_record()
    assert path.parts[-5] == "2026-11-30" and run["gc"] == "freeze" and "gc" not in gpu_plan.settings_added_since(run)


def test_docs_state_the_plan_as_the_code_holds_it():
    doc = (REPO / "docs" / "gpu.md").read_text()
    order = gpu_plan.ORDER
    assert f"holds it as {len(order)} steps ({', '.join(order)})" in doc
    first = gpu_plan.leases()[0]
    worst = gpu_plan.START_S + sum(gpu_plan.worst_case_s(gpu_plan.STEPS[s]) for s in first)
    assert f"the next lease holds {' then '.join(first)} (worst\ncase {worst:.0f} of {gpu_plan.LEASE_S} s)" in doc
    for name, step in gpu_plan.STEPS.items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| {name} |"))
        assert f"--plan {name}`" in row
        if "Worst case" in row:
            assert f"Worst case {gpu_plan.worst_case_s(step):.0f} s" in row, name
