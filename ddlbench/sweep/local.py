"""Local back end: the cells one after another on this machine."""
from __future__ import annotations

import sys
from pathlib import Path

from ddlbench.lifecycle.signals import Stopped, name_of
from ddlbench.sweep import manifest
from ddlbench.sweep.task import run_cell


def run(sweep_dir: Path, indices: list[int]) -> dict[int, int]:
    """Each cell's exit code. A stop signal ends the sweep after the running cell was stopped
    (ddlbench.sweep.task.stop_cell): no further cell starts."""
    cells = manifest.read(sweep_dir)
    # how to go on after a stop: the sweep's own resume, or its owner's (`bench advise resume`)
    resume = manifest.meta(sweep_dir).get("resume_command") or f"bench sweep resume {sweep_dir}"
    codes = {}
    for n, i in enumerate(indices, 1):
        print(f"[{n}/{len(indices)}] cell {i}: {' '.join(cells[i].overrides)}", flush=True)
        try:
            codes[i] = run_cell(sweep_dir, i)
        except (KeyboardInterrupt, Stopped) as exc:
            print(f"sweep stopped by {name_of(exc)} at cell {i} ({n - 1} of {len(indices)} done); "
                  f"continue with `{resume}`", file=sys.stderr, flush=True)
            raise
    return codes
