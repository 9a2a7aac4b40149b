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
# one reference-loop or runner run there, start-up included: gpt2_small ~22 s at batch 32 (step A,
# reports/gpu-h200/2026-11-26); llama_1b as long as one of its cells (34-42 s in step B)
RUN_S = {"gpt2_small": 25, "llama_1b": 40}
# a bench project with calibrate=pieces: the meta profile, llama_8b at 1 and 5 blocks timed with its optimizer, and
# FSDP2's own step at 8 ranks over a fake group (a spawned process) (not yet run)
PROJECT_S = 120


def test_the_plan_dry_run_validates_every_cell_here():
    out = subprocess.run([sys.executable, "benchmarks/gpu_plan.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    cells = sum(len(s.cells) for s in gpu_plan.STEPS.values())
    assert out.stdout.count("\n  ok ") == cells and "INVALID" not in out.stdout
    for name in gpu_plan.STEPS:
        assert f"bash scripts/device_gpu_matrix.sh {name} --plan {name}" in out.stdout


def test_each_step_fits_one_device_call():
    """Cells start until the deadline and the last may run its timeout (+60 s grace); the
    reference-loop runs are not cut by the deadline: each costs what one took on the H200."""
    for name, step in gpu_plan.STEPS.items():
        args = step.matrix_args()
        timeout = float(args[args.index("--timeout") + 1])
        assert step.cells, name
        overhead_s = sum(2 * _repeats(o) * RUN_S[o.split()[0]] for o in step.overhead)
        project_s = PROJECT_S * len(step.project)
        assert step.deadline_s + timeout + 60 + INSTALL_S + overhead_s + project_s <= CALL_LIMIT_S, name


def _repeats(spec: str) -> int:
    return int(next((f.split("=")[1] for f in spec.split() if f.startswith("repeats=")), 3))


def test_plan_expands_to_the_steps_arguments():
    assert gpu_matrix.expand_plan(["--out", "X", "--plan", "A"]) == ["--out", "X", *gpu_plan.STEPS["A"].matrix_args()]
    assert gpu_matrix.expand_plan(["--out", "X"]) == ["--out", "X"]
    a = gpu_plan.STEPS["A"].matrix_args()
    assert a.count("--overhead") == 3 and "cells,overhead" in a
