"""Communication accounting: counters fed where collectives are issued, and analytic volumes."""
from __future__ import annotations

from collections import defaultdict


class CommCounter:
    """Bytes and calls per collective kind, since the last `take()`."""

    def __init__(self) -> None:
        self._bytes: dict[str, int] = defaultdict(int)
        self._calls: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int, calls: int = 1) -> None:
        self._bytes[kind] += int(nbytes)
        self._calls[kind] += calls

    def take(self) -> dict:
        out = {k: {"bytes": self._bytes[k], "calls": self._calls[k]} for k in self._bytes}
        self._bytes.clear()
        self._calls.clear()
        return out


def per_step(totals: dict, steps: int) -> dict:
    """{kind: {'bytes', 'calls'}} over `steps` -> per-step floats."""
    if steps <= 0:
        raise ValueError("steps must be positive")
    return {k: {"bytes": v["bytes"] / steps, "calls": v["calls"] / steps} for k, v in totals.items()}


RING_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "reduce": 1.0,
               "broadcast": 1.0, "all_to_all": 1.0}


def ring_wire_bytes(per_step_bytes: dict, world: int) -> float:
    """Bytes each rank sends per step with bandwidth-optimal (ring / pipelined) algorithms:
    all-reduce 2(N-1)/N x payload; all-gather, reduce-scatter, reduce, broadcast and all-to-all
    (N-1)/N x the full size; point-to-point sends their payload."""
    if world <= 1:
        return 0.0
    frac = (world - 1) / world
    return sum(RING_FACTOR[k] * frac * b if k in RING_FACTOR else (b if k == "send" else 0.0)
               for k, b in per_step_bytes.items())


def analytic_wire_bytes(psi_factor: float, psi_bytes: float, world: int) -> float:
    """The strategy's textbook volume: DDP 2 Psi, ZeRO-3 / FSDP full shard 3 Psi (x (N-1)/N)."""
    if world <= 1:
        return 0.0
    return psi_factor * psi_bytes * (world - 1) / world
