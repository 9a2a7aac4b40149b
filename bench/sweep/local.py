"""Local back end: the cells one after another on this machine."""
from __future__ import annotations

from pathlib import Path

from bench.sweep.task import run_cell


def run(sweep_dir: Path, indices: list[int]) -> dict[int, int]:
    codes = {}
    for n, i in enumerate(indices, 1):
        print(f"[{n}/{len(indices)}] cell {i}", flush=True)
        codes[i] = run_cell(sweep_dir, i)
    return codes
