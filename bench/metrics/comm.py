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


def ring_allreduce_wire_bytes(payload_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `payload_bytes`: 2 * (N-1)/N * payload
    (reduce-scatter + all-gather; Patarasuk & Yuan 2009). DDP per step: payload = 4 * params
    in fp32, i.e. the design's '2 Psi'."""
    if world <= 1:
        return 0.0
    return 2.0 * (world - 1) / world * payload_bytes
