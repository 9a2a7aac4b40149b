"""Communication accounting: counters fed where collectives are issued, and analytic volumes."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass


class CommCounter:
    """Bytes and calls per collective kind since the last `take()`; with the group when known,
    bytes and calls per group too (`group_bytes`, `group_calls`: {'<ranks>@<nodes>': n}; a
    collective among 2 ranks of one node costs differently from one among all 8 ranks of 4 nodes,
    and each call pays the network's latency once)."""

    def __init__(self) -> None:
        self._bytes: dict[str, int] = defaultdict(int)
        self._calls: dict[str, int] = defaultdict(int)
        self._groups: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._group_calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._sizes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._sent: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int, calls: int = 1, group: str | None = None, sent: int | None = None) -> None:
        """`sent`: the bytes this call sent to other ranks where they are known exactly (an
        all-to-all with uneven splits); the kind's wire factor applies otherwise."""
        self._bytes[kind] += int(nbytes)
        if sent is not None:
            self._sent[kind] += int(sent)
        self._calls[kind] += calls
        if group is not None:
            self._groups[kind][str(group)] += int(nbytes)
            self._group_calls[kind][str(group)] += calls
        if kind in SIZED_KINDS:   # a size-dependent wire factor needs each call's size
            self._sizes[kind][f"{group or ''}|{int(nbytes)}"] += calls

    def take(self) -> dict:
        out = {k: {"bytes": self._bytes[k], "calls": self._calls[k]} for k in self._bytes}
        for k, groups in self._groups.items():
            out[k]["group_bytes"] = dict(sorted(groups.items()))
            out[k]["group_calls"] = dict(sorted(self._group_calls[k].items()))
        for k, sizes in self._sizes.items():
            out[k]["sizes"] = dict(sorted(sizes.items()))
        for k, sent in self._sent.items():
            out[k]["sent"] = sent
        self._bytes.clear()
        self._sent.clear()
        self._sizes.clear()
        self._calls.clear()
        self._groups.clear()
        self._group_calls.clear()
        return out


class IssueLog:
    """When a step's gradient messages were handed to a library that sends them in the background
    (Horovod's hooks during backward), as headroom: seconds of the step's compute still to run when
    each was issued. `compute_end()` closes a step's compute (backward done, the wait for the
    messages begins), `step_end()` the step; `take()` gives the last closed step's
    [[headroom_s, bytes], ...] per kind, in issue order.

    `marker()` stamps a moment and `elapsed(a, b)` reads seconds between two stamps: the host clock
    by default; on a GPU CUDA events on the compute stream (`device_clock`), since the host runs
    ahead of the kernels and its clock would time the issuing of backward, not backward. Stamps are
    read in take(), after the window: reading an event waits for it."""

    def __init__(self, marker=time.perf_counter, elapsed=None) -> None:
        self._marker, self._elapsed = marker, elapsed or host_elapsed
        self._pending: list[tuple[str, object, int]] = []
        self._closed: list[tuple[str, object, object, int]] = []   # (kind, issued, compute end or None, bytes)
        self._last: list[tuple[str, object, object, int]] = []

    def add(self, kind: str, nbytes: int, t=None) -> None:
        self._pending.append((kind, self._marker() if t is None else t, int(nbytes)))

    def compute_end(self, t=None) -> None:
        end = self._marker() if t is None else t
        self._closed = [(kind, at, end, nbytes) for kind, at, nbytes in self._pending]
        self._pending.clear()

    def step_end(self) -> None:
        """The step is over: messages issued after compute ended (Horovod's synchronize() sends the
        gradients no hook fired for) belong to it, with no headroom, not to the next step."""
        self._last = self._closed + [(kind, None, None, nbytes) for kind, _, nbytes in self._pending]
        self._closed = []
        self._pending.clear()

    def take(self) -> dict[str, list[list[float]]]:
        out: dict[str, list[list[float]]] = {}
        last = self._last or self._closed
        for kind, at, end, nbytes in last:
            headroom = 0.0 if end is None else max(self._elapsed(at, end), 0.0)
            out.setdefault(kind, []).append([headroom, nbytes])
        self._last, self._closed = [], []
        self._pending.clear()
        return out


def host_elapsed(a: float, b: float) -> float:
    return b - a


def device_clock(device) -> tuple:
    """(marker, elapsed) for IssueLog: CUDA events on the current stream on a GPU, the host clock
    elsewhere."""
    if getattr(device, "type", device) != "cuda":
        return time.perf_counter, host_elapsed
    import torch

    def marker():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return marker, lambda a, b: a.elapsed_time(b) / 1e3


def latest_issue(profiles: list[list[list[float]]]) -> list[list[float]]:
    """One profile for a collective from every rank's: a collective goes once its last rank has
    issued it, so each message's headroom is the smallest over ranks (messages matched in issue
    order; where ranks issued different numbers of messages, the first rank's profile)."""
    if not profiles:
        return []
    if len({len(p) for p in profiles}) != 1:
        return [list(m) for m in profiles[0]]
    return [[min(p[i][0] for p in profiles), profiles[0][i][1]] for i in range(len(profiles[0]))]


def per_step(totals: dict, steps: int) -> dict:
    """{kind: {'bytes', 'calls'[, 'group_bytes', 'group_calls', 'sizes']}} over `steps` -> per-step floats."""
    if steps <= 0:
        raise ValueError("steps must be positive")
    out = {}
    for k, v in totals.items():
        out[k] = {"bytes": v["bytes"] / steps, "calls": v["calls"] / steps}
        if "group_bytes" in v:
            out[k]["group_bytes"] = {g: b / steps for g, b in v["group_bytes"].items()}
        if "group_calls" in v:
            out[k]["group_calls"] = {g: c / steps for g, c in v["group_calls"].items()}
        if "sizes" in v:
            out[k]["sizes"] = {s: c / steps for s, c in v["sizes"].items()}
        if "sent" in v:
            out[k]["sent"] = v["sent"] / steps
        if "issued" in v:       # already one step's: the last probe step's issue profile
            out[k]["issued"] = v["issued"]
    return out


# Bytes each rank sends, averaged over ranks, as a multiple of (N-1)/N x the collective's full
# buffer (all-gather: the gathered size; reduce-scatter: the input size). NCCL: the textbook ring
# / pipelined-chain algorithms (nccl-tests "busbw" factors). Gloo: what ProcessGroupGloo really
# writes to its sockets, measured with /proc/self/io at 2 and 3 ranks (tests/test_wire_bytes.py):
# it runs reduce_scatter_tensor as an all-reduce of the whole input (2x), and reduce as a ring
# reduce-scatter followed by a gather to the root ((N+1)/N for messages up to 2N MiB; above that
# its segmented loop sends more: gloo_reduce_sent, applied per call from the counted sizes).
RING_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "reduce": 1.0,
               "broadcast": 1.0, "all_to_all": 1.0}
BACKEND_FACTOR = {"nccl": {}, "gloo": {"reduce_scatter": lambda n: 2.0, "reduce": lambda n: (n + 1) / n}}
FACTOR_NOTE = {
    "nccl": "ring factors: all-reduce 2(N-1)/N, all-gather / reduce-scatter / reduce / broadcast / "
            "all-to-all (N-1)/N of the full buffer; send = payload",
    "gloo": "gloo factors (measured with /proc/self/io): all-reduce 2(N-1)/N; reduce-scatter 2(N-1)/N "
            "(gloo all-reduces the whole input); reduce (N+1)/N x (N-1)/N up to 2N MiB, per call above "
            "(gloo_reduce_sent); all-gather, broadcast, "
            "all-to-all (N-1)/N of the full buffer; send = payload",
}


SIZED_KINDS = ("reduce",)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def gloo_reduce_sent(total: int, world: int, elem: int = 4, max_segment: int = 1 << 20) -> float:
    """Mean bytes a rank sends in one gloo `reduce` of `total` bytes (root 0), following
    gloo/reduce.cc: segments of min(total / 2N, 1 MiB); the reduce-scatter loop sends one segment
    in each of its numSegments - 2 iterations (all of them past 2N segments, not only (N-1)/N of
    the buffer); then every rank but the root sends its chunk to the root."""
    if world <= 1 or total <= 0:
        return 0.0
    max_segment = elem * (max_segment // elem)
    seg = _round_up(min(-(-total // (2 * world)), max_segment), elem)
    num = _round_up(max(-(-total // seg), 2 * world), world)
    per_rank = num // world
    chunk = per_rank * seg
    sent = 0
    for rank in range(world):
        for i in range(num - 2):
            offset = (((rank + 1) * per_rank + i) * seg) % (num * seg)
            sent += max(0, min(seg, total - offset))
        if rank != 0:
            sent += max(0, min(chunk, total - rank * chunk))
    return sent / world


def rank_wire_bytes(row: dict, world: int, backend: str) -> float:
    """Bytes one rank sends per step for its counted collectives ({kind: {'bytes', 'calls',
    'group_bytes'?, 'sizes'?, 'sent'?}}): per group where groups are known; gloo's reduce per call
    size; what an all-to-all sent as counted from its splits."""
    total = 0.0
    for kind, v in row.items():
        if "sent" in v:      # counted exactly where it was issued (all-to-all: its splits)
            total += v["sent"]
        elif backend == "gloo" and kind == "reduce" and v.get("sizes"):
            for key, count in v["sizes"].items():
                group, size = key.split("|")
                total += gloo_reduce_sent(int(size), group_size(group) if group else world) * count
        elif "group_bytes" in v:
            total += group_wire_bytes({kind: v["group_bytes"]}, backend)
        else:
            total += ring_wire_bytes({kind: v["bytes"]}, world, backend)
    return total


def wire_factor(kind: str, world: int, backend: str = "nccl") -> float:
    """Multiple of the payload one rank sends, on average, for one collective of `kind`."""
    if world <= 1:
        return 0.0
    if kind == "send":
        return 1.0
    if kind not in RING_FACTOR:
        return 0.0
    special = BACKEND_FACTOR.get(backend, {}).get(kind)
    return (special(world) if special else RING_FACTOR[kind]) * (world - 1) / world


def ring_wire_bytes(per_step_bytes: dict, world: int, backend: str = "nccl") -> float:
    """Bytes each rank sends per step (mean over ranks) for these payloads on `backend`
    (factors above; point-to-point sends their payload, receives nothing)."""
    return sum(wire_factor(k, world, backend) * b for k, b in per_step_bytes.items())


# nccl-tests' busbw factors: busbw = algbw x factor, algbw = full buffer bytes / time
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
              "reduce": lambda n: 1.0, "send": lambda n: 1.0, "all_to_all": lambda n: (n - 1) / n}


def bus_bandwidth(kind: str, nbytes: float, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, nccl-tests convention."""
    if seconds <= 0:
        raise ValueError("time must be positive")
    alg = nbytes / seconds
    return alg, alg * BUS_FACTOR[kind](world)


def comm_time(per_rank: list[dict], per_step_bytes: dict, world: int) -> dict:
    """Per-rank overlap summaries (ddlbench.metrics.overlap.overlap_summary, per step) -> the mean
    over ranks per kind and in total, with the achieved bus bandwidth of each kind (its payload
    per step / its time per step, nccl-tests factor): the number to put beside commbench's."""
    n = len(per_rank)
    kinds = sorted({k for r in per_rank for k in r["kinds"]})
    out = {"kinds": {}}
    for kind in kinds:
        rows = [r["kinds"].get(kind, {}) for r in per_rank]
        row = {key: sum(x.get(key, 0.0) for x in rows) / n for key in ("count", "time_s", "overlapped_s", "exposed_s")}
        payload = per_step_bytes.get(kind, 0.0)
        row["busbw_Bps"] = (bus_bandwidth(kind, payload, row["time_s"], world)[1]
                            if payload and row["time_s"] > 0 and kind in BUS_FACTOR else None)
        out["kinds"][kind] = row
    for key in ("time_s", "overlapped_s", "exposed_s", "compute_s"):
        out[key] = sum(r[key] for r in per_rank) / n
    out["exposed_fraction"] = out["exposed_s"] / out["time_s"] if out["time_s"] > 0 else None
    periods = [r.get("periods") or [] for r in per_rank]
    count = min(len(p) for p in periods)
    if count:       # each profiled period's mean over ranks: the fastest, the median, the slowest
        out["periods"] = count
        mean = [sum(p[i]["time_s"] for p in periods) / n for i in range(count)]
        out["time_s_spread"] = spread(mean)
        out["exposed_s_spread"] = spread([sum(p[i]["exposed_s"] for p in periods) / n for i in range(count)])
        for kind, row in out["kinds"].items():
            row["time_s_spread"] = spread([sum(p[i]["kinds"].get(kind, 0.0) for p in periods) / n
                                           for i in range(count)])
    return out


def spread(values: list[float]) -> list[float]:
    """[fastest, median, slowest] of a list."""
    return [min(values), statistics.median(values), max(values)]


def group_size(key: str) -> int:
    """'4@2' (4 ranks on 2 nodes) -> 4."""
    return int(str(key).split("@")[0])


def group_wire_bytes(group_bytes: dict[str, dict], backend: str = "nccl") -> float:
    """Like ring_wire_bytes, with each kind's bytes split by the group it ran in
    ({kind: {'<ranks>@<nodes>': bytes}})."""
    total = 0.0
    for kind, by_group in group_bytes.items():
        for key, b in by_group.items():
            total += ring_wire_bytes({kind: b}, group_size(key), backend)
    return total


@dataclass(frozen=True)
class AnalyticComm:
    """What a strategy sends per step, as payloads per collective kind in units of Psi (fp32
    parameter bytes), following the code path of the installed framework version (`source`),
    and the paper's wire volume beside it (`paper_psi` x Psi x (N-1)/N), labelled as such."""
    payload_psi: dict
    source: str
    paper_psi: float | None = None
    paper: str | None = None


PSI_UNITS = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}


def psi_units(dtype: str) -> float:
    """A model-sized payload in `dtype`, in units of Psi (fp32 parameter bytes)."""
    return PSI_UNITS[dtype]


def analytic_wire_bytes(psi_factor: float, psi_bytes: float, world: int) -> float:
    """A paper's volume: DDP 2 Psi, ZeRO-3 / FSDP full shard 3 Psi (x (N-1)/N)."""
    if world <= 1:
        return 0.0
    return psi_factor * psi_bytes * (world - 1) / world


def analytic_comm(spec: AnalyticComm | None, params: int | None, world: int, backend: str) -> dict:
    """The analytic volume beside a measurement: the strategy's payloads with the wire factors of
    the backend that ran, and the paper's figure."""
    if spec is None or not params:
        return {"analytic_wire_bytes_per_rank": None, "analytic_formula": None}
    psi = 4 * params
    payload = {k: v * psi for k, v in spec.payload_psi.items()}
    terms = " + ".join(f"{k} {v:.4g} Psi" for k, v in sorted(spec.payload_psi.items()))
    return {
        "analytic_wire_bytes_per_rank": ring_wire_bytes(payload, world, backend),
        "analytic_payload_bytes": payload,
        "analytic_formula": f"payloads {terms} (Psi = fp32 parameter bytes) x {backend} wire factors",
        "analytic_source": spec.source,
        "paper_wire_bytes_per_rank": (analytic_wire_bytes(spec.paper_psi, psi, world)
                                      if spec.paper_psi is not None else None),
        "paper_formula": (f"{spec.paper_psi:g} Psi (N-1)/N ({spec.paper})" if spec.paper_psi is not None else None),
    }
