"""Communication accounting: counters fed where collectives are issued, and analytic volumes."""
from __future__ import annotations

from collections import defaultdict


class CommCounter:
    """Bytes and calls per collective kind since the last `take()`; with the group when known,
    bytes per group too (`group_bytes`: {'<ranks>@<nodes>': bytes}; a collective among 2 ranks
    of one node costs differently from one among all 8 ranks of 4 nodes)."""

    def __init__(self) -> None:
        self._bytes: dict[str, int] = defaultdict(int)
        self._calls: dict[str, int] = defaultdict(int)
        self._groups: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, kind: str, nbytes: int, calls: int = 1, group: str | None = None) -> None:
        self._bytes[kind] += int(nbytes)
        self._calls[kind] += calls
        if group is not None:
            self._groups[kind][str(group)] += int(nbytes)

    def take(self) -> dict:
        out = {k: {"bytes": self._bytes[k], "calls": self._calls[k]} for k in self._bytes}
        for k, groups in self._groups.items():
            out[k]["group_bytes"] = dict(sorted(groups.items()))
        self._bytes.clear()
        self._calls.clear()
        self._groups.clear()
        return out


def per_step(totals: dict, steps: int) -> dict:
    """{kind: {'bytes', 'calls'[, 'group_bytes']}} over `steps` -> per-step floats."""
    if steps <= 0:
        raise ValueError("steps must be positive")
    out = {}
    for k, v in totals.items():
        out[k] = {"bytes": v["bytes"] / steps, "calls": v["calls"] / steps}
        if "group_bytes" in v:
            out[k]["group_bytes"] = {g: b / steps for g, b in v["group_bytes"].items()}
    return out


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


def group_size(key: str) -> int:
    """'4@2' (4 ranks on 2 nodes) -> 4."""
    return int(str(key).split("@")[0])


def group_wire_bytes(group_bytes: dict[str, dict]) -> float:
    """Like ring_wire_bytes, with each kind's bytes split by the group it ran in
    ({kind: {'<ranks>@<nodes>': bytes}})."""
    total = 0.0
    for kind, by_group in group_bytes.items():
        for key, b in by_group.items():
            total += ring_wire_bytes({kind: b}, group_size(key))
    return total


def analytic_wire_bytes(psi_factor: float, psi_bytes: float, world: int) -> float:
    """The strategy's textbook volume: DDP 2 Psi, ZeRO-3 / FSDP full shard 3 Psi (x (N-1)/N)."""
    if world <= 1:
        return 0.0
    return psi_factor * psi_bytes * (world - 1) / world
