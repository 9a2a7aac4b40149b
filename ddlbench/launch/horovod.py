"""Horovod's starter (ddlbench/launch/starters.py): `horovodrun --gloo` on one machine; under srun,
the slots and the rendezvous horovodrun would have provided (ddlbench/launch/hvd_slurm.py). The
ranks run ddlbench.launch.hvd_worker, which maps HOROVOD_* to torch's env:// variables. On CPU
(start method fork) horovodrun's commands are clients of a rank server that forks the ranks
(ddlbench/launch/rankserver.py); on GPUs they are the workers themselves (spawned)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from ddlbench.launch.forked import Forked


class Horovodrun:
    def local(self, plan, run_dir: Path, threads: int, method: str):
        from ddlbench.launch.agent import reserve_port
        nproc = plan.cfg.launcher.nproc
        port, held = reserve_port()
        env = dict(os.environ)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
        env.update(plan.variant.launch_env())
        horovodrun = [str(Path(sys.executable).with_name("horovodrun")), "--gloo", "-np", str(nproc),
                      "-H", f"localhost:{nproc}"]
        if method == "fork":     # CPU: ranks forked by the launcher's rank server (ddlbench/launch/rankserver.py)
            from ddlbench.launch import rankserver
            from ddlbench.launch.starters import preload
            preload(plan)
            name = rankserver.address()
            cmd = [*horovodrun, sys.executable, "-m", "ddlbench.launch.hvd_shim", name, str(run_dir), str(threads)]
            proc = Forked(lambda: rankserver.serve_horovodrun(cmd, env, name), new_session=True)
        else:
            cmd = [*horovodrun, sys.executable, "-m", "ddlbench.launch.hvd_worker", str(run_dir), str(threads)]
            proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, env=env)
        proc.held_port = held      # rank 0's store port stays this run's while the process object lives
        return proc

    def slurm_env(self, plan, env: dict) -> None:
        from ddlbench.launch.hvd_slurm import horovod_env
        env.update(horovod_env(os.environ, env["MASTER_ADDR"]), **plan.variant.launch_env())
        env["LOCAL_WORLD_SIZE"] = env["HOROVOD_LOCAL_SIZE"]

    @contextlib.contextmanager
    def slurm_session(self, env: dict):
        """Rank 0 serves the rendezvous (Horovod's own HTTP server) for the step's tasks."""
        from ddlbench.launch.hvd_slurm import Rendezvous
        rendezvous = Rendezvous(env)
        try:
            yield
        finally:
            rendezvous.close()
