"""Rank entry under horovodrun: `horovodrun --gloo -np N python -m ddlbench.launch.hvd_worker RUN_DIR THREADS`.

Horovod starts the processes; this maps HOROVOD_* to torch's env:// variables (the runner
gathers its per-rank series through a torch gloo group after the window) and, like torch
elastic's @record, writes the first error of each rank to RUN_DIR/errors/rank<N>.json (plus started/done markers).
"""
from __future__ import annotations

import os
import sys
import traceback

from ddlbench.record.results import atomic_write_json
from ddlbench.record.rundir import RunDir


def main(run_dir: str, threads: int) -> int:
    rank = os.environ.get("HOROVOD_RANK", "0")
    os.environ.update(RANK=rank, WORLD_SIZE=os.environ.get("HOROVOD_SIZE", "1"),
                      LOCAL_RANK=os.environ.get("HOROVOD_LOCAL_RANK", "0"),
                      LOCAL_WORLD_SIZE=os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    rd = RunDir(run_dir)
    rd.errors.mkdir(exist_ok=True)
    # started/done markers let the launcher name a rank that died without a word (SIGKILL)
    rd.rank_error(rank, "started").touch()
    try:
        from ddlbench.launch.worker import run_rank
        run_rank(run_dir, threads)
        rd.rank_error(rank, "done").touch()
        return 0
    except BaseException as exc:  # noqa: BLE001 - recorded, then the rank exits non-zero
        atomic_write_json(rd.rank_error(rank), {
            "rank": int(rank), "exitcode": 1, "signal": None,
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:]})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
