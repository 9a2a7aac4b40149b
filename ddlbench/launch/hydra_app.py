"""Hydra's own multirun, for users who prefer its launcher plugins, e.g. Slurm via submitit
(one job array; Hydra waits for it):

    python -m ddlbench.launch.hydra_app -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu \\
        framework=ddp,fsdp_full launcher.nproc=1,2

Each job validates its config exactly like `bench run` and runs it with the local launcher in
Hydra's job directory (result.json beside Hydra's .hydra/). `bench sweep --backend slurm` is the
non-blocking, resumable alternative.
"""
from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> str:
    from hydra.core.hydra_config import HydraConfig

    from ddlbench.launch.base import launcher_for
    from ddlbench.planning.config import validate

    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    raw["run"]["dir"] = str(run_dir)
    plan = validate(raw)
    record = launcher_for(plan).launch(plan, run_dir)
    if record is None:       # a Slurm task other than rank 0
        return "ok"
    print(f"{run_dir}: {record.status}")
    return record.status


if __name__ == "__main__":
    main()
