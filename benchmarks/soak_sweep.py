"""Soak: a local sweep of N tiny cells (every other one made to fail), interrupted with kill -9
at a random moment, then resumed. Checks that exactly N result files exist, one per cell, with
the expected statuses, that no process is left behind, and that `bench report` accounts for all
N cells. Prints the timings.

    .venv/bin/python benchmarks/soak_sweep.py --cells 200      # by hand (~30 min on 2 cores)
    .venv/bin/python benchmarks/soak_sweep.py --cells 10       # what CI runs (tests/test_soak.py)
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "ddlbench.cli"]


def _leftovers(sweep: Path) -> list[str]:
    """Processes whose command line names the sweep directory, other than this script."""
    out = subprocess.run(["pgrep", "-af", str(sweep)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if "pgrep" not in line and line.split()[0] != str(os.getpid())]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200, help="even number of cells")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=None, help="seed of the kill moment")
    args = ap.parse_args()
    if args.cells < 2 or args.cells % 2:
        ap.error("--cells must be an even number >= 2")
    sweep = args.dir or Path(tempfile.mkdtemp(prefix="soak_")) / "sweep"
    rng = random.Random(args.seed)
    overrides = ["debug=fast", "logger=none", "launcher.nproc=1", "run.warmup_steps=0", "run.measure_steps=1",
                 f"run.seed=range(0,{args.cells // 2})", "fault.kind=none,raise"]
    t0 = time.monotonic()
    proc = subprocess.Popen([*BENCH, "sweep", "--dir", str(sweep), *overrides], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill -9 once a random number of cells (1 .. half) have results, a random fraction of a
    # cell later: the moment depends on progress, not on how fast this machine is
    kill_after, delay = rng.randint(1, args.cells // 2), rng.uniform(0.0, 1.0)
    while proc.poll() is None and len(list(sweep.glob("*/result.json"))) < kill_after:
        time.sleep(0.05)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    t_kill = time.monotonic() - t0
    done_at_kill = len(list(sweep.glob("*/result.json")))
    resume = subprocess.run([*BENCH, "sweep", "resume", str(sweep)], cwd=REPO, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True)
    t_end = time.monotonic() - t0
    results = sorted(sweep.glob("*/result.json"))
    import json
    statuses = [json.loads(p.read_text())["status"] for p in results]
    report = subprocess.run([*BENCH, "report", str(sweep), "-o", str(sweep.parent / "report")], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True)
    rows = list(csv.DictReader(open(sweep.parent / "report" / "summary.csv"))) if report.returncode == 0 else []
    left = _leftovers(sweep)
    print(f"cells {args.cells}; kill -9 {'at' if killed else 'NOT DONE, sweep ended by'} {t_kill:.1f} s with "
          f"{done_at_kill} results; resume exit {resume.returncode}; all done at {t_end:.1f} s")
    print(f"result files {len(results)}: {statuses.count('ok')} ok, {statuses.count('failed')} failed; "
          f"report rows {len(rows)}; leftover processes {len(left)}")
    problems = []
    if not killed:
        problems.append("the sweep ended before the kill: the interruption was not tested")
    if len(results) != args.cells:
        problems.append(f"{len(results)} result files, expected {args.cells}")
    if statuses.count("ok") != args.cells // 2 or statuses.count("failed") != args.cells // 2:
        problems.append(f"statuses {statuses.count('ok')} ok / {statuses.count('failed')} failed")
    if len(rows) != args.cells:
        problems.append(f"report has {len(rows)} rows: {report.stderr[-500:]}")
    if left:
        problems.append(f"processes left: {left}")
    if resume.returncode not in (0, 1):   # 1 = some cells failed (they were made to)
        problems.append(f"resume exited {resume.returncode}: {resume.stderr[-1000:]}")
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
