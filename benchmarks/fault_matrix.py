"""The fault matrix, timed: each rank-level fault injected once into a 2-rank DDP run (gpt2_tiny,
CPU/gloo) and the time from the fault to the run's end, read from the files the run leaves.

    .venv/bin/python benchmarks/fault_matrix.py OUT_DIR

time to detect = result.json written - the moment the fault fired (the injector writes
<run>/fault_fired with the wall-clock time). The tests that prove each guarantee are named in
docs/guarantees.md ("What is guaranteed when things go wrong"). Exits 1 if any run ended with another status
than expected (an empty OUT_DIR each time; old results are an error).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from runs import reuse, verdict

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "ddlbench.cli"]
CASES = [  # name, overrides, expected status
    ("rank raises at step 2", ["debug=fault_raise"], "failed"),
    ("rank SIGKILLed at step 2", ["debug=fault_kill"], "failed"),
    ("rank hangs at step 2 (pg timeout 5 s)", ["debug=fault_hang", "run.pg_timeout_s=5"], "timeout"),
    ("rank hangs at step 2 (wall clock 20 s)", ["debug=fault_hang", "run.timeout_s=20"], "timeout"),
    ("slow rank (0.2 s per step)", ["debug=fault_sleep"], "ok"),
]


def main() -> int:
    out = Path(sys.argv[1])
    statuses = []
    print(f"{'fault':42} {'status':8} {'expected':8} {'run wall s':>10} {'detect s':>8}  detail")
    for i, (name, ov, want) in enumerate(CASES):
        run_dir = out / f"case{i}"
        reuse(run_dir, resume=False, resumable=False)   # a fault's timing means something only when measured now
        t0 = time.monotonic()
        subprocess.run([*BENCH, "run", "launcher.nproc=2", "logger=none", f"run.dir={run_dir}", *ov], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        rec = json.loads((run_dir / "result.json").read_text())
        t_end = (run_dir / "result.json").stat().st_mtime
        fired = float((run_dir / "fault_fired").read_text()) if (run_dir / "fault_fired").exists() else None
        detect = f"{t_end - fired:8.1f}" if fired and want != "ok" else "       -"
        err = rec.get("error") or {}
        detail = err.get("message", "") if rec["status"] != "ok" else "; ".join(rec.get("warnings") or [])
        detail = detail.strip().splitlines()[0][:100] if detail.strip() else ""
        print(f"{name:42} {rec['status']:8} {want:8} {wall:10.1f} {detect}  {detail}")
        statuses.append((rec["status"], want))
    code = verdict(statuses)
    print("every fault ended as expected" if code == 0 else
          f"{sum(g != w for g, w in statuses)} run(s) ended with another status than expected")
    return code


if __name__ == "__main__":
    sys.exit(main())
