"""Predicted step time of a candidate (pure; hand-checked in tests/test_advise.py).

    step = compute + communication          (no overlap assumed: an upper bound, stated)

except a pipeline of one stage per rank (GPipe, 1F1B), whose sends overlap the next micro-batch's
compute: a flow shop over the stages and the link's two directions (pipeline_step).

compute: 1-rank DDP calibration runs of the same model measure the step time t(m) at the grid's
smallest and largest micro-batch (grad_accum 1); between them t is affine in m (t = a + b m: a
fixed per-step cost plus a per-sample cost). Each other framework's 1-rank run at its largest
micro-batch gives its factor over DDP (hooks, DTensor, engine: `compute_scale`). A candidate runs
grad_accum micro-batches of its own size plus its pipeline bubble (the cost model's idle slots),
its share of the model's compute (1 / (tp x pp) where they split it), and recomputes the
checkpointed blocks' forward (x hardware / model FLOPs of ddlbench/models/flops.py):

    compute = t(m) x recompute x (grad_accum + bubble_slots) x compute_share

communication: the collectives of the framework's cost model (ddlbench.adapters.cost.Traffic,
declared by its adapter: data-parallel payloads in as many messages as it splits them into,
per micro-batch where it communicates per micro-batch; tensor-parallel all-reduces; pipeline
sends), each priced on the network model of `bench project` (ddlbench.network.model.collective_time)
over the dimensions its group spans.
"""
from __future__ import annotations

import math

from ddlbench.adapters.cost import CostModel, Traffic
from ddlbench.estimate.memory import Layout
from ddlbench.network.model import Network, collective_time, kind_spans


def compute_at(micro_batch: int, calibration: dict[int, float]) -> float:
    """calibration: {micro_batch: 1-rank step seconds at grad_accum 1}; t(micro_batch), affine
    between the smallest and the largest point (proportional with one point)."""
    if not calibration:
        raise ValueError("calibration needs at least one (micro_batch, seconds) point")
    points = sorted(calibration.items())
    (m0, t0), (m1, t1) = points[0], points[-1]
    t = t0 * micro_batch / m0 if m1 == m0 else t0 + (t1 - t0) * (micro_batch - m0) / (m1 - m0)
    return max(t, 0.0)


def step_compute(layout: Layout, cost: CostModel, calibration: dict[int, float], recompute: float = 1.0) -> float:
    return (compute_at(layout.micro_batch, calibration) * recompute * (layout.grad_accum + cost.bubble_slots)
            * cost.compute_share)


def spans(network: Network, ranks: int, stride: int) -> list:
    """[(members along dimension i, dimension i)] for a group of `ranks` members `stride` ranks
    apart, devices filling the network innermost first (ddlbench.network.model.layout)."""
    if ranks * stride > network.max_devices:
        raise ValueError(f"{ranks * stride} devices exceed network {network.name} ({network.max_devices})")
    out, left = [], ranks
    for d in network.dims:
        n = min(left, d.size // stride) if stride < d.size else 1
        out.append((n, d))
        left = math.ceil(left / n)
        stride = max(1, stride // d.size)
    return out


def comm_seconds(items: tuple[Traffic, ...] | list[Traffic], network: Network, algorithm: str = "best") -> tuple[float, dict]:
    total, parts = 0.0, {}
    for c in items:
        t, alg = collective_time(c.kind, c.bytes,
                                 kind_spans(network, c.kind, spans(network, c.ranks, c.stride), c.bytes), algorithm)
        t *= c.count
        total += t
        key = f"{c.kind} x{c.count:g} over {c.ranks} ({alg})"
        parts[key] = parts.get(key, 0.0) + t
    return total, parts


def pipeline_step(slot_s: float, micro_batches: int, stages: int, send_s: float) -> float:
    """Seconds of one step of a one-stage-per-rank pipeline whose sends overlap compute, as a flow
    shop: each micro-batch passes every stage's compute slot (forward + backward, `slot_s`) and,
    between neighbouring stages, one send each way (`send_s`; activations forward and their
    gradients backward use the two directions of the link, each carrying one message per micro-
    batch). The busiest resource paces the micro-batches after the first, which crosses the
    whole chain:
        (m - 1) x max(slot, send) + pp x slot + 2 (pp - 1) x send
    Without sends this is (m + pp - 1) x slot, the bubble formula; with sends slower than a slot
    the link sets the pace and compute hides behind it. Stated as an approximation: 1F1B
    interleaves forward and backward, GPipe runs them as two phases."""
    m, pp = micro_batches, stages
    return (m - 1) * max(slot_s, send_s) + pp * slot_s + 2 * (pp - 1) * send_s


def predict(layout: Layout, cost: CostModel, calibration: dict[int, float], network: Network,
            recompute: float = 1.0, algorithm: str = "best", compute_scale: float = 1.0,
            comm_scale: float = 1.0) -> dict:
    """compute_scale: the framework's own compute relative to DDP's (its 1-rank calibration run)
    x, on a CPU host whose ranks share cores, the oversubscription (rank threads per core).
    comm_scale: the framework's own collectives relative to the network model's price of torch's
    (1 unless measured: advise/rank.comm_factor).
    A pipeline whose cost model says its sends overlap compute (`pipeline_stages`) is priced by
    pipeline_step, its other collectives (the data-parallel all-reduce after the schedule) added."""
    compute = step_compute(layout, cost, calibration, recompute if layout.checkpointing else 1.0) * compute_scale
    comm, parts = comm_seconds(cost.traffic, network, algorithm)
    comm, parts = comm * comm_scale, {k: v * comm_scale for k, v in parts.items()}
    sends = [t for t in cost.traffic if t.kind == "send" and t.count]
    if cost.pipeline_stages > 1 and sends:
        m = layout.grad_accum
        slot = compute / (m + cost.bubble_slots)
        send_total = comm_seconds(sends, network, algorithm)[0] * comm_scale
        per_send = send_total / sum(t.count for t in sends)
        step = pipeline_step(slot, m, cost.pipeline_stages, per_send) + (comm - send_total)
        return {"compute_s": compute, "comm_s": comm, "step_s": step, "comm_parts_s": parts,
                "exposed_comm_s": step - compute}
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm, "comm_parts_s": parts}


def layout(d, cost, ep: int = 1) -> dict:
    """What each mesh dimension does, in the specification's vocabulary: a sharding strategy's
    shard group is dp_shard (HSDP: its shard groups; the rest replicate); ep: the expert-parallel
    ranks, borrowed from dp_shard (torchtitan's layout)."""
    shard = cost.shard_ranks if (cost.shard_params or cost.shard_grads or cost.shard_optimizer) else 1
    shard = max(1, shard // d.cp)   # Ulysses' ZeRO shards over the sequence-parallel ranks too (cp folded in)
    return {"dp_replicate": d.dp // shard, "dp_shard": shard, "cp": d.cp, "tp": d.tp, "pp": d.pp,
            "micro_batch": d.micro_batch, "grad_accum": d.grad_accum, "ep": ep}
