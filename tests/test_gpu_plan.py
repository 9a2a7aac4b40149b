"""The GPU plan (benchmarks/gpu_plan.py): every cell of every step is a valid configuration, each
step fits one device call, and gpu_matrix's --plan stands for the step's arguments."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_matrix  # noqa: E402
import gpu_plan  # noqa: E402

CALL_LIMIT_S = 600      # the device tool's limit on one command
INSTALL_S = 60          # the carried wheels and DeepSpeed's build there: 18 s on the H200


def test_the_plan_dry_run_validates_every_cell_here():
    out = subprocess.run([sys.executable, "benchmarks/gpu_plan.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    cells = sum(len(s.cells) for s in gpu_plan.STEPS.values())
    assert out.stdout.count("\n  ok ") == cells and "INVALID" not in out.stdout
    for name in gpu_plan.STEPS:
        assert f"bash scripts/device_gpu_matrix.sh {name} --plan {name}" in out.stdout


def test_each_step_fits_one_device_call():
    for name, step in gpu_plan.STEPS.items():
        args = step.matrix_args()
        timeout = float(args[args.index("--timeout") + 1])
        assert step.cells, name
        if not step.overhead:   # cells start until the deadline; the last may run its timeout (+60 s grace)
            assert step.deadline_s + timeout + 60 + INSTALL_S <= CALL_LIMIT_S, name
            continue
        # the reference-loop runs are not cut by the deadline: at most 8 (a gpt2_small run took
        # 17-54 s on the H200, start-up included), after two short cells
        runs = sum(2 * int(next((f.split("=")[1] for f in o.split() if f.startswith("repeats=")), 3))
                   for o in step.overhead)
        assert runs <= 8 and len(step.cells) <= 2 and step.deadline_s <= 60, name


def test_plan_expands_to_the_steps_arguments():
    assert gpu_matrix.expand_plan(["--out", "X", "--plan", "A"]) == ["--out", "X", *gpu_plan.STEPS["A"].matrix_args()]
    assert gpu_matrix.expand_plan(["--out", "X"]) == ["--out", "X"]
    a = gpu_plan.STEPS["A"].matrix_args()
    assert a.count("--overhead") == 2 and "cells,overhead" in a
