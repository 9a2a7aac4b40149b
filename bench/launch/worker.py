"""Per-rank entry point (started by the elastic agent with torchrun's environment)."""
from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


def pick_device(requested: str):
    import torch
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


@record
def rank_main(run_dir: str, threads: int) -> None:
    from bench.adapters.base import peak_rss_bytes
    import torch
    import torch.distributed as dist
    from bench.config import validate
    from bench.adapters.base import RankContext
    from bench import runner

    run_dir_p = Path(run_dir)
    plan = validate(json.loads((run_dir_p / "config.json").read_text()))
    torch.set_num_threads(threads)
    device, backend = pick_device(plan.cfg.run.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    baseline_rss = peak_rss_bytes()
    dist.init_process_group(backend, timeout=timedelta(seconds=plan.cfg.run.pg_timeout_s))
    try:
        ctx = RankContext(rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                          world_size=dist.get_world_size(), device=device, backend=backend,
                          precision=plan.cfg.run.precision)
        runner.run(plan, ctx, run_dir_p, baseline_rss, threads)
    finally:
        dist.destroy_process_group()
