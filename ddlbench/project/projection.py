"""Projection of a measured run to other world sizes on a modelled network (pure functions,
hand-checked in tests/test_network.py).

    step(N) = compute(N) + exposed(N)
    exposed(N) = sum over the step's collectives of (1 - overlap) x their time on N devices, or,
                 for a collective whose messages the run saw handed over during backward
                 (Horovod), the part of its time the link has not drained when compute ends (`drained`)

(a collective kind's payload in a group priced as its measured number of messages, each of
bytes / calls, ddlbench.project.workload)

compute: from a 1-rank result of the same configuration (`compute_from`), else the measured
step time minus the communication the model predicts for the measured run on the network it
ran on (`measured_on`, e.g. conf/network/local_gloo.yaml calibrated on the machine). Weak
scaling keeps the per-device batch (compute constant); strong scaling keeps the global batch
(compute proportional to the per-device batch — linear, an approximation for small batches).
Scaling efficiency = throughput per device / one device's throughput without communication.
"""
from __future__ import annotations

from ddlbench.network.model import Dimension, Network, collective_time, kind_spans, layout
from ddlbench.project.workload import Collective, Workload


def spans_for(scope: str, network: Network, devices: int) -> list:
    lay = layout(network, devices)
    pairs = list(zip(lay, network.dims))
    if scope == "world":
        return pairs
    if scope == "node":
        return pairs[:1]
    if scope == "across":
        return [(1, network.dims[0])] + pairs[1:]
    raise ValueError(f"unknown scope {scope}")


def measured_spans(c: Collective, network: Network) -> list[tuple[int, Dimension]]:
    if c.nodes <= 1 or len(network.dims) == 1:
        return [(c.ranks, network.dims[0])]
    if c.ranks % c.nodes:
        raise ValueError(f"a group of {c.ranks} ranks on {c.nodes} nodes: uneven, no rule to price it")
    return [(c.ranks // c.nodes, network.dims[0]), (c.nodes, network.dims[1])]


def drained(duration: float, issued) -> float:
    """Seconds a step waits for a collective after its compute ends, when the link drains the
    collective's messages in the order they were handed over, each as soon as it is: message i,
    issued with headroom h_i (compute seconds still to run), cannot finish before the bytes from
    it on have crossed (duration x their share of the payload), so the wait is
        max(0, max_i (duration x bytes_from_i / bytes - h_i))
    (a work-conserving queue's finish time; all at headroom 0 gives the whole duration)."""
    order = sorted(issued, key=lambda m: -m[0])
    total = sum(b for _, b in order)
    if total <= 0:
        return duration
    left, wait = total, 0.0
    for headroom, nbytes in order:
        wait = max(wait, duration * left / total - headroom)
        left -= nbytes
    return max(wait, 0.0)


def priced(work: Workload, network: Network, devices: int, algorithm: str = "best",
           measured_groups: bool = False) -> list[tuple[Collective, float, str]]:
    """Each collective of the step with its seconds on `devices` and the algorithm that priced it.
    measured_groups: price each collective over its measured group on the network the run ran on:
    its ranks on the first dimension (one host), or, where the group spanned several nodes, its
    ranks per node on the first dimension and its nodes on the second (`bench cluster`'s links)."""
    out = []
    for c in work.collectives:
        spans = measured_spans(c, network) if measured_groups else spans_for(c.scope, network, devices)
        message = c.bytes / c.calls
        t, alg = collective_time(c.kind, message, kind_spans(network, c.kind, spans, message), algorithm)
        out.append((c, t * c.calls, alg))
    return out


def step_comm(work: Workload, network: Network, devices: int, algorithm: str = "best",
              measured_groups: bool = False, overlap: float = 0.0,
              compute_scale: float = 1.0) -> tuple[float, dict, float]:
    """One pricing of the step's collectives: (seconds of communication, seconds per collective
    kind, seconds the step waits for it). The wait: collectives with an issue profile drained
    under backward (headroom x compute_scale, for a per-device batch other than the measured one),
    the others exposed but for the stated `overlap` fraction."""
    total, parts, exposed = 0.0, {}, 0.0
    for c, t, alg in priced(work, network, devices, algorithm, measured_groups):
        total += t
        key = f"{c.kind}/{c.scope} ({alg})"
        parts[key] = parts.get(key, 0.0) + t
        exposed += (drained(t, [(h * compute_scale, b) for h, b in c.issued]) if c.issued
                    else (1.0 - overlap) * t)
    return total, parts, exposed


def comm_time(work: Workload, network: Network, devices: int, algorithm: str = "best",
              measured_groups: bool = False) -> tuple[float, dict]:
    """Seconds of communication per step on `devices`, and seconds per collective kind."""
    return step_comm(work, network, devices, algorithm, measured_groups)[:2]


def exposed_time(work: Workload, network: Network, devices: int, algorithm: str = "best",
                 measured_groups: bool = False, overlap: float = 0.0, compute_scale: float = 1.0) -> float:
    """Seconds per step the step waits for communication (step_comm's third value)."""
    return step_comm(work, network, devices, algorithm, measured_groups, overlap, compute_scale)[2]


def compute_seconds(work: Workload, measured_on: Network | None = None, compute_from: Workload | None = None,
                    algorithm: str = "best") -> tuple[float, str]:
    if compute_from is not None:
        return (compute_from.step_s * work.per_device_batch / compute_from.per_device_batch,
                f"1-rank result ({compute_from.label}), scaled to the per-device batch")
    if work.world == 1 or not work.collectives:
        return work.step_s, "measured step (no communication)"
    if measured_on is None:
        raise ValueError("need measured_on (the network the run ran on) or compute_from")
    exposed = exposed_time(work, measured_on, work.world, algorithm, measured_groups=True)
    return (max(work.step_s - exposed, 0.0),
            f"measured step minus {exposed * 1e3:.2f} ms of exposed communication modelled on {measured_on.name}")


def project(work: Workload, network: Network, world_sizes: list[int], compute_s: float,
            scaling: str = "weak", algorithm: str = "best", overlap: float = 0.0) -> list[dict]:
    if scaling not in ("weak", "strong"):
        raise ValueError("scaling must be weak or strong")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError("overlap must be in [0, 1]")
    global0 = work.per_device_batch * work.world
    single = work.per_device_batch / compute_s if compute_s > 0 else float("inf")
    rows = []
    for n in world_sizes:
        per_dev = work.per_device_batch if scaling == "weak" else global0 / n
        compute = compute_s * per_dev / work.per_device_batch
        comm, parts, exposed = step_comm(work, network, n, algorithm, overlap=overlap,
                                         compute_scale=per_dev / work.per_device_batch)
        step = compute + exposed
        sps = per_dev * n / step
        rows.append({"devices": n, "layout": layout(network, n), "per_device_batch": per_dev,
                     "global_batch": per_dev * n, "compute_s": compute, "comm_s": comm,
                     "exposed_comm_s": exposed, "step_s": step, "samples_per_s": sps,
                     "tokens_per_s": sps * work.tokens_per_sample if work.tokens_per_sample else None,
                     "comm_share": exposed / step if step > 0 else 0.0,
                     "scaling_efficiency": (sps / n) / single if single != float("inf") else None,
                     "comm_parts_s": parts})
    return rows
