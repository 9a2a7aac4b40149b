"""Result files with known numbers, for report arithmetic tests."""
from __future__ import annotations

import copy

from ddlbench.record.results import Record

CONFIG = {
    "framework": {"name": "ddp", "variant": "default"},
    "model": {"name": "gpt2_tiny", "kind": "language"},
    "data": {"name": "markov"},
    "optim": {"name": "adamw", "lr": 0.001, "weight_decay": 0.0},
    "launcher": {"name": "local", "nproc": 1},
    "logger": {"name": "none"},
    "run": {"global_batch": 8, "seed": 0, "precision": "fp32", "repeat": 0, "epochs": 2, "dir": "x"},
}


def make_record(run_id: str, framework="ddp", variant="default", world=1, global_batch=8, sps=100.0,
                repeat=0, lr=0.001, seed=0, status="ok", ttt=None, evals=None, **extra) -> dict:
    cfg = copy.deepcopy(CONFIG)
    cfg["framework"].update(name=framework, variant=variant)
    cfg["launcher"]["nproc"] = world
    cfg["run"].update(global_batch=global_batch, repeat=repeat, seed=seed, dir=f"/runs/{run_id}")
    cfg["optim"]["lr"] = lr
    rec = Record.new(run_id, cfg, status=status).to_json()
    if status != "ok":
        rec["error"] = {"type": "exception", "message": extra.get("message", "boom"), "rank": 1}
        return rec
    rec["parallel"] = {"world_size": world, "nodes": 1, "dp": world, "tp": 1, "pp": 1,
                       "micro_batch": global_batch // world, "grad_accum": 1, "global_batch": global_batch}
    rec["env"] = {"device": "cpu", "torch": "2.x", "hostnames": ["h"]}
    rec["timing"] = {"warmup_steps": 1, "measured_steps": 3,
                     "step_time_s": {"median": global_batch / sps, "mean": global_batch / sps, "p10": 0, "p90": 0, "std": 0}}
    rec["throughput"] = {"samples_per_s": sps, "tokens_per_s": sps * 128, "samples_per_s_per_device": sps / world}
    rec["memory"] = {"per_rank": [{"rank": r, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
                                   "peak_rss_bytes": 1000 + r} for r in range(world)],
                     "model_state_bytes_per_rank_theory": 500}
    rec["mfu"] = 0.1
    rec["convergence"].update(eval=evals or [], time_to_target_s=ttt, target=2.0, target_metric="loss",
                              floor={"loss": 1.5, "accuracy": 0.5})
    return rec


def write(root, rec) -> None:
    d = root / rec["run_id"]
    d.mkdir(parents=True)
    Record.from_json(rec).write(d)
