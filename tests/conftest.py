"""Shared helpers: real `bench` processes on CPU/gloo, tiny presets, few steps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "bench.cli"]


def bench(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return subprocess.run([*BENCH, *args], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def run_record(run_dir: Path, *overrides: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    """`bench run` with test defaults; returns the process and the result record."""
    proc = bench("run", "logger=none", "run.progress=false", f"run.dir={run_dir}", *overrides,
                 timeout=timeout)
    path = run_dir / "result.json"
    assert path.exists(), f"no result.json\nstdout:{proc.stdout}\nstderr:{proc.stderr[-3000:]}"
    return proc, json.loads(path.read_text())


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
