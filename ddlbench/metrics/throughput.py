"""Throughput and scaling efficiency (docs/design.md §5)."""
from __future__ import annotations

from typing import Optional


def throughput(global_batch: int, step_s: float, world_size: int,
               tokens_per_sample: Optional[int] = None) -> dict:
    """samples/s = global_batch / global step time (the window estimator,
    ddlbench.metrics.timing.window_step_time); tokens/s for language models."""
    if step_s <= 0:
        raise ValueError("step time must be positive")
    sps = global_batch / step_s
    return {"samples_per_s": sps,
            "tokens_per_s": sps * tokens_per_sample if tokens_per_sample else None,
            "samples_per_s_per_device": sps / world_size}


def scaling_efficiency(x_n: float, n: int, x_n0: float, n0: int) -> float:
    """E = (X_N / N) / (X_N0 / N0); weak or strong depending on what was held fixed."""
    if min(n, n0) < 1 or x_n0 <= 0:
        raise ValueError("world sizes must be >= 1 and baseline throughput > 0")
    return (x_n / n) / (x_n0 / n0)


def scaling_kind(global_batches: dict[int, int]) -> str:
    """world_size -> global_batch of comparable runs: 'strong' if the global batch is fixed,
    'weak' if the per-device batch is fixed, else 'mixed' (no efficiency is meaningful)."""
    if len(set(global_batches.values())) == 1:
        return "strong"
    if len({gb / n for n, gb in global_batches.items()}) == 1:
        return "weak"
    return "mixed"
