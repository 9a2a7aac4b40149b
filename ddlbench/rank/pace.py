"""How many steps a run takes, decided on the ranks outside every step and agreed over them: where
warm-up ends (run.warmup_max_steps: ddlbench/metrics/warmup.py) and how long the measured window is
(run.min_window_s: ddlbench/metrics/window.py). A strategy with phases is told the new total."""
from __future__ import annotations

import torch.distributed as dist

from ddlbench.adapters.base import Periodic
from ddlbench.metrics import warmup as rule
from ddlbench.metrics.window import window_steps


def settle(step_s: list[float], warmup: int, min_steps: int, max_steps: int, world_size: int) -> dict:
    """run.warmup_max_steps: whether warm-up ends after these `warmup` steps, agreed over ranks
    (every rank's steps settled, or the cap reached): {'steps', 'stopped': 'settled' | 'cap' | None
    (go on), 'drift_per_rank', ...} (metrics/warmup.py)."""
    drifts: list = [None] * world_size
    dist.all_gather_object(drifts, rule.drift(step_s))
    settled = all(rule.within(d) for d in drifts)
    stopped = "settled" if settled else "cap" if warmup >= max_steps else None
    return {"steps": warmup, "stopped": stopped, "drift_per_rank": drifts, "min_steps": min_steps,
            "max_steps": max_steps, "span": rule.SPAN, "tolerance": rule.TOLERANCE, "rule": rule.RULE}


def replan(setup) -> None:
    if isinstance(setup.strategy, Periodic):
        setup.strategy.plan_steps(setup.total, None)


def size_window(setup, cfg, warmup: int, last_warm_step_s: float, world_size: int) -> dict:
    """run.min_window_s: the slowest rank's last warm-up step, agreed once over ranks, sets how many
    steps fill the window (metrics/window.py); a strategy with phases is told the new total."""
    paces: list = [None] * world_size
    dist.all_gather_object(paces, last_warm_step_s)
    pace = max(paces)
    measure = window_steps(cfg.run.measure_steps, cfg.run.min_window_s, pace)
    setup.total = warmup + measure
    replan(setup)
    return {"min_window_s": cfg.run.min_window_s, "warm_step_s": pace, "measure_steps": measure,
            "requested_measure_steps": cfg.run.measure_steps,
            "rule": "measured steps = max(run.measure_steps, ceil(run.min_window_s / the slowest rank's last "
                    "warm-up step)), agreed over ranks after the warm-up"}
