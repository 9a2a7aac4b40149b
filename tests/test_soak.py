"""The sweep soak at CI size (benchmarks/soak_sweep.py --cells 200 is the by-hand version): 10
tiny cells, half made to fail, the sweep killed with SIGKILL at a random moment and resumed:
exactly 10 results with the right statuses, a report row for each, no process left behind."""
import subprocess
import sys

import pytest
from conftest import REPO, for_runs, run_bounded

pytestmark = pytest.mark.slow


def test_interrupted_sweep_resumes_to_the_full_set(tmp_path):
    # 10 cells (forked from the sweep: ~1-2 s each after the first), each its own 20 s, + resume + report
    proc = run_bounded([sys.executable, str(REPO / "benchmarks" / "soak_sweep.py"), "--cells", "10",
                        "--dir", str(tmp_path / "sweep")], for_runs(12, 20), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "result files 10: 5 ok, 5 failed; report rows 10; leftover processes 0" in proc.stdout
