"""Local back end: the cells one after another on this machine."""
from __future__ import annotations

from pathlib import Path

from ddlbench.sweep import manifest
from ddlbench.sweep.task import run_cell


def run(sweep_dir: Path, indices: list[int]) -> dict[int, int]:
    cells = manifest.read(sweep_dir)
    codes = {}
    for n, i in enumerate(indices, 1):
        print(f"[{n}/{len(indices)}] cell {i}: {' '.join(cells[i].overrides)}", flush=True)
        codes[i] = run_cell(sweep_dir, i)
    return codes
