"""Views of a finished run (W&B). They read result.json + metrics.jsonl; they never touch the
timed loop, and a sink failure is a warning, never a failed run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def log_to_sinks(plan, run_dir: Path, record: dict) -> None:
    lg = plan.cfg.logger
    if lg.name == "none" or lg.mode == "disabled":
        return
    # A child process with a hard bound: W&B cannot stall or crash the run that produced the data.
    budget = lg.init_timeout_s + 60
    cmd = [sys.executable, "-m", "bench.sinks.wandb_sink", str(run_dir)]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=budget)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            print(f"bench: warning: W&B logging failed: {tail[0]}", file=sys.stderr)
        else:
            print(proc.stdout.strip())
    except subprocess.TimeoutExpired:
        print(f"bench: warning: W&B logging exceeded {budget:.0f} s and was stopped", file=sys.stderr)
