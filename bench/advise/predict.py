"""Predicted step time of a candidate (pure; hand-checked in tests/test_advise.py).

    step = compute + communication          (no overlap assumed: an upper bound, stated)

compute: 1-rank DDP calibration runs of the same model measure the step time t(m) at the grid's
smallest and largest micro-batch (grad_accum 1); between them t is affine in m (t = a + b m: a
fixed per-step cost plus a per-sample cost). Each other framework's 1-rank run at its largest
micro-batch gives its factor over DDP (hooks, DTensor, engine: `compute_scale`). A candidate runs grad_accum
micro-batches of its own size, its model divided over tp x pp ranks, with the pipeline bubble of
(pp - 1) idle micro-batch slots, and recomputes the checkpointed blocks' forward (x hardware /
model FLOPs of models/flops.py):

    compute = t(m) x recompute x (grad_accum + pp - 1) / (tp x pp)

communication: the collectives the strategy issues per optimizer step, priced on the network
model of `bench project` (bench.network.model.collective_time, over the group each runs in):
    data parallel (dp ranks): the adapter's own analytic payloads (AnalyticComm) x Psi / (tp pp),
        in as many messages as the framework splits them into (units, buckets: `messages`); FSDP
        hybrid: those inside its shard group, then an all-reduce of the shard across the groups;
    tensor parallel (tp ranks): 2 all-reduces of one block's output in forward and 2 in backward
        per block and micro-batch (Megatron-LM's f/g operators);
    pipeline (pp ranks): one send of a block's output forward and one of its gradient backward
        per stage boundary and micro-batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from bench.advise.memory import Layout, ModelProfile
from bench.network.model import Network, collective_time


@dataclass(frozen=True)
class Collective:
    kind: str
    bytes: float
    ranks: int
    stride: int        # rank distance between the group's members (tp innermost, pp outermost)
    count: int = 1     # issued this many times per step


def step_compute(layout: Layout, calibration: dict[int, float], recompute: float = 1.0) -> float:
    """calibration: {micro_batch: 1-rank step seconds at grad_accum 1}."""
    if not calibration:
        raise ValueError("calibration needs at least one (micro_batch, seconds) point")
    points = sorted(calibration.items())
    (m0, t0), (m1, t1) = points[0], points[-1]
    m = layout.micro_batch
    t = t0 * m / m0 if m1 == m0 else t0 + (t1 - t0) * (m - m0) / (m1 - m0)
    return max(t, 0.0) * recompute * (layout.grad_accum + layout.pp - 1) / (layout.tp * layout.pp)


DDP_BUCKET_BYTES = 25 * 2**20          # DDP bucket_cap_mb default
FUSION_BYTES = {"horovod": 128 * 2**20, "deepspeed_zero1": 2e9, "deepspeed_zero2": 2e9}   # fusion / reduce bucket


def messages(framework: str, psi: float, blocks: int) -> int:
    """How many collectives the data-parallel payload is split into (each pays the latency):
    FSDP and ZeRO-3 one per sharded unit (every block and the root), DDP one per 25 MiB bucket,
    Horovod one per fusion buffer, ZeRO-1/2 one per reduce bucket."""
    if framework in ("fsdp_full", "fsdp_grad_op", "fsdp_hybrid", "deepspeed_zero3", "tensor_parallel"):
        return blocks + 1
    return max(1, math.ceil(psi / FUSION_BYTES.get(framework, DDP_BUCKET_BYTES)))


def collectives(layout: Layout, model: ModelProfile, dp_payload_psi: dict[str, float]) -> list[Collective]:
    """What one optimizer step sends, per group. dp_payload_psi: {kind: payload in units of Psi}
    for the data-parallel part (Psi = fp32 bytes of this rank's model piece)."""
    psi = 4.0 * model.params / (layout.tp * layout.pp)
    out = []
    shard = layout.shard or layout.dp
    if shard > 1:
        n = messages(layout.framework, psi, model.blocks // layout.pp)
        out += [Collective(kind, f * psi / n, shard, layout.tp, count=n)
                for kind, f in sorted(dp_payload_psi.items()) if f]
    if layout.dp > shard:       # FSDP hybrid: the shards' gradients all-reduced across the replicas
        n = messages(layout.framework, psi / shard, model.blocks // layout.pp)
        out.append(Collective("all_reduce", psi / shard / n, layout.dp // shard, layout.tp * shard, count=n))
    act = model.boundary_bytes_per_sample * layout.micro_batch
    if layout.tp > 1:
        per_step = 4 * (model.blocks // layout.pp) * layout.grad_accum
        out.append(Collective("all_reduce", act, layout.tp, 1, count=per_step))
    if layout.pp > 1:
        out.append(Collective("send", act / layout.tp, 2, layout.dp * layout.tp, count=2 * layout.grad_accum))
    return out


def spans(network: Network, ranks: int, stride: int) -> list:
    """[(members along dimension i, dimension i)] for a group of `ranks` members `stride` ranks
    apart, devices filling the network innermost first (bench.network.model.layout)."""
    if ranks * stride > network.max_devices:
        raise ValueError(f"{ranks * stride} devices exceed network {network.name} ({network.max_devices})")
    out, left = [], ranks
    for d in network.dims:
        n = min(left, d.size // stride) if stride < d.size else 1
        out.append((n, d))
        left = math.ceil(left / n)
        stride = max(1, stride // d.size)
    return out


def comm_seconds(items: list[Collective], network: Network, algorithm: str = "best") -> tuple[float, dict]:
    total, parts = 0.0, {}
    for c in items:
        t, alg = collective_time(c.kind, c.bytes, spans(network, c.ranks, c.stride), algorithm)
        t *= c.count
        total += t
        key = f"{c.kind} x{c.count} over {c.ranks} ({alg})"
        parts[key] = parts.get(key, 0.0) + t
    return total, parts


def predict(layout: Layout, model: ModelProfile, calibration: dict[int, float], network: Network,
            dp_payload_psi: dict[str, float], recompute: float = 1.0, algorithm: str = "best",
            compute_scale: float = 1.0) -> dict:
    """compute_scale: the framework's own compute relative to DDP's (its 1-rank calibration run)
    x, on a CPU host whose ranks share cores, the oversubscription (rank threads per core)."""
    compute = step_compute(layout, calibration, recompute if layout.checkpointing else 1.0) * compute_scale
    comm, parts = comm_seconds(collectives(layout, model, dp_payload_psi), network, algorithm)
    return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm, "comm_parts_s": parts}
