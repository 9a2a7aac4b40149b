"""What a pipeline rank does to its stages beyond the schedule (ddlbench/adapters/pipeline.py):
its own copy of a weight tied across stages and the group that sums their gradients, and FSDP2
inside every stage (torchtitan's 3-D layout)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ddlbench.adapters.common import local_tensor

Tied = list[tuple[list[nn.Parameter], Optional[dist.ProcessGroup]]]


def untie_across_ranks(tied, ranges, owners, local_ids, stage_modules, dims, rank: int) -> tuple[Tied, set[int]]:
    """Each stage its own copy of every tied parameter (models.pipeline.untie) and, where the
    copies sit on two pipeline ranks, a group of those ranks per column of the other mesh
    dimensions (dp_replicate, dp_shard, cp, tp: the two ranks hold the same shard of it). Every rank
    creates every group (new_group is collective). ([(local copies, group or None)], the clones' ids)."""
    from ddlbench.models.pipeline import untie
    stage_of = {i: s for s, r in enumerate(ranges) for i in r}
    untied, clones = untie(tied, stage_of, dict(zip(local_ids, stage_modules)))
    columns = torch.arange(dims.world_size).reshape(dims.pp, -1)
    out = []
    for copies, stages in untied:
        holders = sorted({owners[s] for s in stages})
        mine = None
        if len(holders) > 1:
            for col in range(columns.shape[1]):
                ranks = [int(columns[h, col]) for h in holders]
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
        if copies or mine is not None:
            out.append((copies, mine))
    return out, clones


def shard_stages(stage_modules: list, blocks: list[list], mesh, precision: str, tied: Tied, clones: set[int]):
    """FSDP2 on every stage (fully_shard per block in `blocks`, then the stage), over `mesh`
    (dp_shard, or dp_replicate x dp_shard: HSDP), parameters kept gathered through the step
    (reshard_after_forward=False: torchtitan's default under pipelining, no re-gather per
    micro-batch). fully_shard gives each module new Parameter objects: the tied copies and the
    clones' ids are found again by name. (Sharded, tied, clones)."""
    from ddlbench.adapters.parallelize import apply_fully_shard
    where = {}     # id -> (stage index, name, the parameter: kept alive while ids are compared)
    for k, module in enumerate(stage_modules):
        for name, p in module.named_parameters(remove_duplicate=False):
            where.setdefault(id(p), (k, name, p))
    sharded = None
    for module, units in zip(stage_modules, blocks):
        sharded = apply_fully_shard(module, mesh, precision, reshard_after_forward=False, blocks=units)

    def now(p):
        k, name, _ = where[id(p)]
        return stage_modules[k].get_parameter(name)
    return (sharded, [([now(c) for c in copies], group) for copies, group in tied],
            {id(now(p)) for _, _, p in where.values() if id(p) in clones})


def sum_tied_gradients(tied: Tied) -> None:
    """A tied weight's gradient: the sum over every copy, local and remote, given to each (FSDP2:
    each copy's local shard; the ranks of a group hold the same shard of it)."""
    from torch.distributed.tensor import DTensor
    for copies, group in tied:
        grads = [local_tensor(c.grad) for c in copies if c.grad is not None]
        total = torch.stack(grads).sum(0) if grads else torch.zeros_like(local_tensor(copies[0]))
        if group is not None:
            dist.all_reduce(total, group=group)
        for c in copies:
            if c.grad is not None:
                with torch.no_grad():
                    local_tensor(c.grad).copy_(total)
            elif isinstance(c, DTensor):
                c.grad = DTensor.from_local(total.clone(), c.device_mesh, c.placements)
            else:
                c.grad = total.clone()


def data_parallel_traffic(dims, model, piece: float, precision: str, stages_per_rank: int) -> list:
    """A pipeline rank's data-parallel traffic a step, `piece` its parameters. Plain replicas: one
    flattened fp32 all-reduce of its gradients over dp after the schedule. FSDP2 inside the stages
    (dp_shard): its parameters all-gathered once a step in the compute dtype (kept gathered to the
    last backward: reshard_after_forward=False), their fp32 gradients reduce-scattered once, and the
    shards all-reduced over dp_replicate (HSDP); one message per unit (its blocks, each stage's root)."""
    from ddlbench.adapters.cost import DTYPE_BYTES, split
    tp, shard = dims.tp, dims.dp_shard
    if shard == 1:
        return split("all_reduce", 4.0 * piece, 1, dims.dp, stride=tp, what="gradients")
    units = max(1, model.blocks // dims.pp) + stages_per_rank
    return (split("all_gather", DTYPE_BYTES[precision] * piece, units, shard, stride=tp,
                  what="stage parameters (FSDP2, gathered once a step)")
            + split("reduce_scatter", 4.0 * piece, units, shard, stride=tp, what="stage gradients (FSDP2)")
            + split("all_reduce", 4.0 * piece / shard, units, dims.dp_replicate, stride=shard * tp,
                    what="gradient shards (HSDP)"))


def fsdp_stage_buffers(piece: float, precision: str, micro_batches: int) -> dict:
    """FSDP2 inside pipeline stages (reshard_after_forward=False): every unit of the rank's stages
    stays gathered through the step in the compute dtype; and torch's pipelining turns gradient sync
    off for every backward but the last (PipelineStage.backward_maybe_with_nosync), so with 2+
    micro-batches each unit's unsharded gradients accumulate, in the reduce dtype (fp32:
    FSDPParam.to_accumulated_grad_if_needed), until the step's one reduce-scatter."""
    from ddlbench.adapters.cost import DTYPE_BYTES
    out = {"every unit of the rank's stages gathered through the step": DTYPE_BYTES[precision] * piece}
    if micro_batches > 1:
        out["unsharded gradients accumulated in fp32 over the micro-batches (sync on the last)"] = 4.0 * piece
    return out
