"""Shared by the benchmarks that run `bench run` into OUT_DIR: old results are never reused
silently. A run directory that already holds a result.json is an error unless --resume was
given; with it, the result is read back and the row says so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


class StaleResult(SystemExit):
    """OUT_DIR already holds this run's result and --resume was not given."""


def reuse(run_dir: Path, resume: bool, resumable: bool = True) -> bool:
    """True: read the existing result (resume). False: the run must be made. Raises StaleResult
    when a result exists and resuming was not asked for (or the script cannot resume)."""
    if not (Path(run_dir) / "result.json").exists():
        return False
    if not resume:
        how = ("pass --resume to reuse it (its numbers are then not re-measured), or choose an empty OUT_DIR"
               if resumable else "this benchmark measures every run now: choose an empty OUT_DIR")
        raise StaleResult(f"{run_dir} already holds a result.json from an earlier run: {how}")
    return True


def verdict(statuses: list[tuple[str, str]]) -> int:
    """Exit code of a benchmark that checks outcomes: 1 if any (got, expected) pair differs."""
    return int(any(got != want for got, want in statuses))


def bench_run(run_dir: Path, resume: bool, overrides, timeout: float = 1800, missing: dict | None = None) -> dict:
    """`bench run run.dir=RUN_DIR OVERRIDES` (unless --resume finds its result), and its result.json;
    `missing` (default {"status": "no result"}) where the run left none."""
    if not reuse(run_dir, resume):
        subprocess.run([sys.executable, "-m", "ddlbench.cli", "run", f"run.dir={run_dir}", *overrides],
                       capture_output=True, text=True, timeout=timeout)
    path = Path(run_dir) / "result.json"
    return json.loads(path.read_text()) if path.exists() else (missing or {"status": "no result"})
