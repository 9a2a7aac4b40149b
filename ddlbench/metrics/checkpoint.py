"""Pure arithmetic of a run's checkpoints (ddlbench/rank/saves.py measures, the record holds it):
what the steps lost while an async save was written, and the rate a save reached."""
from __future__ import annotations

from typing import Optional


def persist_slowdown(steps: list[tuple[float, float]], begin: float, end: float, baseline: float) -> dict:
    """`steps`: (end time, duration) of each measured step; the persist window (begin, end]: from
    the save's return to the moment it was durable. The steps that ran during any of it (a write
    done within one step slows that step), their mean duration and its excess over `baseline` (the
    run's median step): 0.07 = 7% slower while the checkpoint was written."""
    inside = [d for t, d in steps if t - d < end and t > begin]
    mean = sum(inside) / len(inside) if inside else None
    excess = mean / baseline - 1 if mean is not None and baseline > 0 else None
    return {"steps": len(inside), "mean_step_s": mean, "excess": excess}


def rate(nbytes: Optional[int], seconds: Optional[float]) -> Optional[float]:
    """Bytes per second, None where either is unknown or the time is not positive."""
    if not nbytes or not seconds or seconds <= 0:
        return None
    return nbytes / seconds


def summarize_saves(per_rank: list[list[dict]]) -> list[dict]:
    """One row per save from every rank's rows ({step, blocked_s, durable_s, bytes, slowdown}): the
    loop was blocked as long as its slowest rank (max), durable when the last rank's write was
    (max), the bytes summed, the slowdown the largest any rank saw."""
    rows = []
    for saves in zip(*per_rank):
        durable = [s["durable_s"] for s in saves]
        excess = [s["slowdown"]["excess"] for s in saves if (s.get("slowdown") or {}).get("excess") is not None]
        rows.append({"step": saves[0]["step"],
                     "blocked_s": max(s["blocked_s"] for s in saves),
                     # of it, waiting for the previous async save to be durable (it was still being written)
                     "waited_s": max(s.get("waited_s") or 0.0 for s in saves),
                     "durable_s": None if any(d is None for d in durable) else max(durable),
                     "bytes_per_rank": [s["bytes"] for s in saves],
                     "bytes": sum(s["bytes"] or 0 for s in saves),
                     # files in the save's directory (rank 0 counts them once durable: None elsewhere)
                     "files": next((s["files"] for s in saves if s.get("files") is not None), None),
                     # host memory pinned to stage it (async_pinned), per rank; 0: none
                     "pinned_bytes_per_rank": [s.get("pinned_bytes") or 0 for s in saves],
                     "slowdown": max(excess) if excess else None,
                     "errors": [s["error"] for s in saves if s.get("error")]})
    return rows
