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


def shard_stages(stage_modules: list, blocks: list[list], mesh, precision: str, tied: Tied, clones: set[int],
                 experts: list[list] | None = None, experts_mesh=None):
    """FSDP2 on every stage (fully_shard per block in `blocks`, then the stage), over `mesh`
    (dp_shard, or dp_replicate x dp_shard: HSDP), parameters kept gathered through the step
    (reshard_after_forward=False: torchtitan's default under pipelining, no re-gather per
    micro-batch). fully_shard gives each module new Parameter objects: the tied copies and the
    clones' ids are found again by name. `experts` (per stage, with expert parallelism): units of their own
    over `experts_mesh` (the edp ranks that hold the same experts), first. (Sharded, tied, clones)."""
    from ddlbench.adapters.parallelize import apply_fully_shard
    where = {}     # id -> (stage index, name, the parameter: kept alive while ids are compared)
    for k, module in enumerate(stage_modules):
        for name, p in module.named_parameters(remove_duplicate=False):
            where.setdefault(id(p), (k, name, p))
    sharded = None
    for k, (module, units) in enumerate(zip(stage_modules, blocks)):
        sharded = apply_fully_shard(module, mesh, precision, reshard_after_forward=False, blocks=units,
                                    experts=tuple(experts[k]) if experts else (), experts_mesh=experts_mesh)

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


def shard_stage_experts(stage_modules: list, family, dims, ep: int, device_type: str):
    """Expert parallelism inside the stages over the pipeline's data-parallel ranks (its replicas, or with
    FSDP2 its dp_shard ranks, from which the ep ranks are borrowed as torchtitan and NeMo Automodel borrow
    them): a mesh (pp, edp = dp / ep, ep, tp) on the same ranks as the pipeline's, each stage's MoE layers
    keeping 1/ep of their experts and dispatching over `ep` (ddlbench/models/moe.py). (mesh, each stage's
    experts modules); (None, []) at ep 1."""
    if ep == 1:
        return None, []
    from torch.distributed.device_mesh import init_device_mesh

    from ddlbench.models.moe import shard_experts, stage_experts
    mesh = init_device_mesh(device_type, (dims.pp, dims.dp // ep, ep, dims.tp), mesh_dim_names=("pp", "edp", "ep", "tp"))
    group, rank = mesh["ep"].get_group(), mesh["ep"].get_local_rank()
    experts = [stage_experts(m, family) for m in stage_modules]
    shard_experts(None, group, ep, rank, [e for per_stage in experts for e in per_stage])
    return mesh, experts


def parameter_ids(modules: list[list]) -> set[int]:
    """The ids of the parameters of every module in every list (again after FSDP2 replaced them)."""
    return {id(p) for per_stage in modules for m in per_stage for p in m.parameters()}


def divide_expert_gradients(params: list, expert_ids: set, ep: int) -> None:
    """Under FSDP2 inside the stages: FSDP2 averaged each expert's gradient over the edp ranks that hold
    it, and the gradient already summed its ep group's tokens (the all-to-all's backward), so / ep gives
    the mean over all dp_shard ranks (torchtitan sets FSDP2's divide factor instead: PREMUL_SUM, not in gloo)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None and id(p) in expert_ids:
                local_tensor(p.grad).div_(ep)


def static_boundaries(piece_list: list, model, local_ids: list[int], n_stages: int, micro_batch: int, precision,
                      device, sharded=None) -> dict:
    """{stage: {input_args, output_args}} for a causal LM's local stages, on the meta device: the token ids
    [micro_batch, T] into the first, the hidden states [micro_batch, T, H] between stages, the logits
    [micro_batch, T, V] out of the last, their dtypes from the embedding and the head run on two tokens under
    the run's precision (T: the model's max_position_embeddings, the sequence the data cuts). Under FSDP2
    (`sharded`) the pieces run on meta with their parameters in FSDP2's param_dtype, as FSDP2 gathers them."""
    seq = model.net.config.max_position_embeddings
    with torch.no_grad(), precision.forward_context():
        if sharded is None:
            hidden = piece_list[0](torch.zeros(1, 2, dtype=torch.long, device=device))
            logits = piece_list[-1](hidden)
        else:
            dtype = sharded.mp_policy.param_dtype if sharded.mp_policy is not None else None
            hidden = _on_meta(piece_list[0], dtype, torch.zeros(1, 2, dtype=torch.long, device="meta"))
            logits = _on_meta(piece_list[-1], dtype, hidden)
    ids = torch.empty(micro_batch, seq, dtype=torch.long, device="meta")
    h = torch.empty(micro_batch, seq, hidden.shape[-1], dtype=hidden.dtype, device="meta", requires_grad=True)
    out = torch.empty(micro_batch, seq, logits.shape[-1], dtype=logits.dtype, device="meta")
    return {s: {"input_args": ids if s == 0 else h, "output_args": out if s == n_stages - 1 else h} for s in local_ids}


def _on_meta(module, dtype, x):
    """`module`'s output on meta, with meta stand-ins for its parameters (floating-point ones in `dtype`; None:
    each its own dtype) and buffers; the module itself is not changed."""
    from torch.func import functional_call
    state = {n: torch.empty(t.shape, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype, device="meta")
             for n, t in module.named_parameters()}
    state.update({n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in module.named_buffers()})
    return functional_call(module, state, (x,))


def average_replica_gradients(params: list, dp: int, dp_group, expert_ids: set, ep_mesh) -> None:
    """The replicas' mean gradient, one flattened all-reduce after the schedule: the dense parameters' over dp;
    an expert's gradient already holds its ep group's tokens (the all-to-all's backward), so it is summed over
    the replicas that hold the same experts (edp) and divided by dp alike."""
    dense = [local_tensor(p.grad) for p in params if p.grad is not None and id(p) not in expert_ids]
    experts = [p.grad for p in params if p.grad is not None and id(p) in expert_ids]
    for grads, group in ((dense, dp_group), (experts, ep_mesh["edp"].get_group() if ep_mesh is not None else None)):
        if not grads:
            continue
        flat = torch._utils._flatten_dense_tensors(grads)
        if dist.get_world_size(group) > 1:
            dist.all_reduce(flat, group=group)
        flat /= dp
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)


def whole_parameter(p, expert_ids: set, ep_mesh) -> torch.Tensor:
    """A parameter as one rank would hold it: an expert's gathered over the ep ranks (collective), in expert order."""
    from ddlbench.adapters.common import full_tensor
    t = full_tensor(p)
    if id(p) in expert_ids:
        parts = [torch.empty_like(t) for _ in range(ep_mesh["ep"].size())]
        dist.all_gather(parts, t.contiguous(), group=ep_mesh["ep"].get_group())
        t = torch.cat(parts)
    return t


def schedule_microbatches(options, dims) -> tuple[int, int]:
    """(micro-batches one schedule runs, schedules a step): `framework.options.n_microbatches` where it is
    fewer than the step's micro-batches (gradient accumulation over a pipeline, as NeMo Automodel and
    torchtitan run it: the schedule stepped grad_accum / n times, its fill and drain each time), else every
    micro-batch in one schedule."""
    m = getattr(options, "n_microbatches", None) or dims.grad_accum
    return m, max(1, dims.grad_accum // m)


def data_parallel_traffic(dims, model, piece: float, precision: str, stages_per_rank: int, repeats: int = 1) -> list:
    """A pipeline rank's data-parallel traffic a step, `piece` its parameters. Plain replicas: one
    flattened fp32 all-reduce of its gradients over dp after the schedule(s). FSDP2 inside the stages
    (dp_shard): its parameters all-gathered once a schedule in the compute dtype (kept gathered to the
    last backward: reshard_after_forward=False), their fp32 gradients reduce-scattered once a schedule,
    and the shards all-reduced over dp_replicate (HSDP); one message per unit (its blocks, each stage's
    root); `repeats` schedules a step."""
    from ddlbench.adapters.cost import DTYPE_BYTES, split
    tp, shard = dims.tp, dims.dp_shard * dims.cp     # context parallelism: FSDP2 over dp_shard x cp (stage_context)
    if shard == 1:
        return split("all_reduce", 4.0 * piece, 1, dims.dp, stride=tp, what="gradients")
    units = max(1, model.blocks // dims.pp) + stages_per_rank
    return (split("all_gather", DTYPE_BYTES[precision] * piece, units, shard, stride=tp, per_step=repeats,
                  what="stage parameters (FSDP2, gathered once a schedule)")
            + split("reduce_scatter", 4.0 * piece, units, shard, stride=tp, per_step=repeats,
                    what="stage gradients (FSDP2)")
            + split("all_reduce", 4.0 * piece / shard, units, dims.dp_replicate, stride=shard * tp, per_step=repeats,
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


def pipeline_cost(o, v: int, dims, model, precision: str):
    """A pipeline rank's cost model (ddlbench/adapters/pipeline.py; `o` its options, v stages a rank). A rank
    holds 1/pp of the blocks (v stage pieces of 1/(pp v) each), split again by tp. Per micro-batch it sends its
    stages' outputs forward and their gradients backward (v boundaries each way, in the activations' dtype:
    the whole activation on every tp rank, or its 1/tp part of the sequence with sequence parallelism) to the
    next/previous stage dp x tp ranks away; inside a stage tensor parallelism all-reduces each block's
    row-wise outputs in forward and column-wise inputs' gradients in backward (ModelProfile.tp_all_reduces),
    or with sequence parallelism all-gathers before attention and the MLP and reduce-scatters after each,
    both ways; loss parallelism splits the head over the vocabulary (its logits 1/tp on a rank) and sums 3
    fp32 values a position; expert parallelism over the replicas (ep) all-to-alls each MoE block's routed tokens
    twice each way and keeps 1/ep of its experts, whose gradients are all-reduced over the dp / ep replicas that
    hold them; with FSDP2 (dp_shard, the ep ranks borrowed from it) the dense part is FSDP2's over dp_shard and the
    experts over the dp_shard / ep ranks holding them, a rank keeping 1/dp_shard of the stage's whole state. Context parallelism (cp) cuts every sequence over cp ranks: compute, activations, sends and TP's
    collectives 1/cp, the ring's k/v all-gathers (forward and backward) and fp32 gradient passes per block, and
    FSDP2 over dp_shard x cp (torchtitan's fold). Data parallelism otherwise: data_parallel_traffic. Bubble, each schedule of the step: (pp - 1) slots for
    GPipe and 1F1B, (pp - 1) / v interleaved (Narayanan et al. 2021); zero-bubble: the interleaved bound.
    Activations in flight (of one schedule: schedule_microbatches): GPipe all its micro-batches, 1F1B pp - r on stage r (the last stage, whose head and
    loss save the most, one), interleaved 1F1B the peak along torch's order (interleaved_in_flight: rank 0 at
    pp 8, v 2: 11.5), the zero-bubble ones at most pp. Stages are cut as the adapter cuts them
    (models.pipeline.partition, stage_owners): the embedding joins the first stage, the head (GPT-2: a second
    copy of the tied embedding) the last; compute is the busiest rank's, memory each rank's own (`per_rank`:
    its pieces, the micro-batches it holds, the logits only where the head is; the estimate takes the largest
    total) and the top-level figures each part's largest over the ranks (an upper bound). The last
    stage keeps its output of every micro-batch until the next step begins (output_chunks; GPT-2: the
    logits; 1/tp of them under loss parallelism)."""
    from dataclasses import replace

    from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, autocast_copies, pipeline_share, split
    from ddlbench.metrics.pipeline import interleaved_in_flight
    pp, tp, dp, m, cp = dims.pp, dims.tp, dims.dp, dims.grad_accum, dims.cp
    ms, repeats = schedule_microbatches(o, dims)    # a schedule's micro-batches (what is in flight), schedules a step
    sp, lp = tp > 1 and o.sequence_parallel, tp > 1 and o.loss_parallel
    if lp:
        model = model.vocab_split()
    if sp:      # an untied embedding row-wise over the vocabulary (decoder.sp_stage)
        model = model.embedding_split(tp)
    flights = ([ms] * pp if o.schedule == "gpipe" else [min(pp - r, ms) for r in range(pp)] if o.schedule == "1f1b"
               else [interleaved_in_flight(r, pp, v, ms) for r in range(pp)] if o.schedule == "interleaved_1f1b"
               else [min(pp, ms)] * pp)      # 1F1B: stage r min(pp - r, m), the last stage one
    mine = pipeline_share(model, o.schedule, pp, v, tp, flights)
    ranks = rank_shares(model, o.schedule, pp, v, tp)
    ep = getattr(o, "ep", 1)
    sparse = model.sparse_blocks() if ep > 1 else []
    layer_experts = model.experts_params / max(model.moe_layers, 1) if ep > 1 else 0.0

    def moe_in(indices) -> float:     # MoE blocks among a rank's pieces (0: the embedding); none counted at ep 1
        if not sparse:
            return 0.0
        return sum(1 for i in indices if 0 < i <= model.blocks and sparse[i - 1]) if indices is not None \
            else model.moe_layers / pp
    # expert parallelism over the replicas: a rank keeps 1/ep of its MoE blocks' experts
    held = [(share.params - layer_experts * (1 - 1 / ep) * moe_in(idx), share, last, idx) for share, last, idx in ranks] \
        or [(mine.params - layer_experts * (1 - 1 / ep) * moe_in(None), mine, True, None)]
    piece = max(h[0] for h in held)
    act = model.boundary_bytes_per_sample * dims.micro_batch / 4 * DTYPE_BYTES[precision] / cp     # 1/cp of the sequence
    blocks = (model.blocks // pp) * m       # a rank's blocks' passes a step
    traffic = split("send", act / tp if sp else act, 1, 2 if pp > 1 else 1, stride=dp * cp * tp, per_step=2 * v * m,
                    what="activations and their gradients", data_parallel=False)
    if cp > 1:      # the ring (context_parallel.cost_model's): the cp ranks' k and v (1/tp of the heads) each pass
        kv = model.kv_heads / model.attention_heads if model.attention_heads else 1.0
        part = act / DTYPE_BYTES[precision] * 2 * kv / tp
        traffic += (split("all_gather", part * DTYPE_BYTES[precision] * cp, 1, cp, stride=tp, per_step=2 * blocks,
                          what="keys and values (forward, and again in backward)", data_parallel=False)
                    + split("all_to_all", part * 4.0, 1, cp, stride=tp, per_step=cp * blocks,
                            what="keys' and values' gradients round the ring (fp32)", data_parallel=False))
    if sp:
        traffic += (split("all_gather", act, 1, tp, per_step=4 * blocks, what="sequence parts", data_parallel=False)
                    + split("reduce_scatter", act, 1, tp, per_step=4 * blocks, what="sequence parts", data_parallel=False))
    elif tp > 1:
        traffic += split("all_reduce", act, 1, tp, per_step=sum(model.tp_all_reduces()) * blocks,
                         what="block outputs (tensor parallel)", data_parallel=False)
    if lp:
        positions = model.boundary_bytes_per_sample / 4 / max(model.hidden_size, 1) * dims.micro_batch
        traffic += split("all_reduce", 4.0 * positions, 1, tp, per_step=3 * m, what="cross-entropy over vocabulary shards",
                         data_parallel=False)
    shard = dims.dp_shard * cp      # FSDP2 over dp_shard x cp (torchtitan's fold: the cp ranks always shard)
    if ep > 1:      # tokens to their experts and back, each way; the experts' gradients over the ranks holding them
        routed = model.routed_bytes_per_sample * dims.micro_batch
        moe_here = max(moe_in(idx) for *_, idx in held)
        local_experts = layer_experts / ep * moe_here
        traffic += split("all_to_all", routed, 1, ep, stride=tp, per_step=4 * moe_here * m, what="routed tokens",
                         data_parallel=False)
        if shard > 1:   # ep borrowed from dp_shard: the dense part FSDP2 over dp_shard, the experts over dp_shard / ep
            traffic += (data_parallel_traffic(dims, model, piece - local_experts, precision, v, repeats)
                        + split("all_gather", DTYPE_BYTES[precision] * local_experts, max(1, round(moe_here)), dp // ep,
                                stride=ep * tp, per_step=repeats, what="stage experts (FSDP2, gathered once a schedule)")
                        + split("reduce_scatter", 4.0 * local_experts, max(1, round(moe_here)), dp // ep,
                                stride=ep * tp, per_step=repeats, what="expert gradients (FSDP2)"))
        else:
            traffic += (split("all_reduce", 4.0 * (piece - local_experts), 1, dp, stride=tp, what="gradients (dense)")
                        + split("all_reduce", 4.0 * local_experts, 1, dp // ep, stride=ep * tp,
                                what="gradients (experts)"))
    else:
        traffic += data_parallel_traffic(dims, model, piece, precision, v, repeats)
    tied = model.stage_tied_params(tp) if pp > 1 else 0.0
    if tied:     # the first and the last stage each hold a copy: their gradients summed (_sync_grads)
        traffic += split("all_reduce", 4.0 * tied, 1, 2, stride=(pp - 1) * dp * cp * tp,
                         what="tied weight's gradient (first and last stage)", data_parallel=False)
    out_share = (1 / tp if lp else 1.0) / cp
    # the state a rank keeps: its gathered part, or, with the ep ranks borrowed from dp_shard, 1/dp_shard of the stage's
    # dense part and of all its experts (each expert 1/ep of them over the dp_shard / ep ranks holding them)
    state = [share.params if ep > 1 and shard > 1 else params for params, share, *_ in held]

    def buffers(params: float, last: bool) -> dict:
        out = autocast_copies(params, precision) if shard == 1 else fsdp_stage_buffers(params, precision, ms)
        if pp > 1:
            out["send and receive buffers"] = 2 * 2 * (act / tp if sp else act)
            if last:    # the last stage keeps every micro-batch's output until the schedule's next step (output_chunks)
                out["last stage's outputs, every micro-batch"] = ms * dims.micro_batch * model.output_bytes_per_sample * out_share
        if ep > 1:
            out["all-to-all send and receive buffers (one layer)"] = 2 * model.routed_bytes_per_sample * dims.micro_batch
        return out
    cost = CostModel(
        f"torch.distributed.pipelining {o.schedule}, {v} stage(s) per rank" + (
            f", FSDP2 over {shard} ranks inside each" if shard > 1 else ""), max(state),
        shard_ranks=shard if shard > 1 else dp, shard_optimizer=shard > 1, shard_grads=shard > 1,
        shard_params=shard > 1, backward_grad_bytes=DTYPE_BYTES[precision] if shard > 1 else 0,    # FSDP2's param_dtype
        largest_weight=model.largest_weight_params, buffers=buffers(piece, True), activation_share=mine.activations / cp,
        in_flight=max(flights), compute_share=mine.compute / cp, output_share=out_share,
        bubble_slots=repeats * (pp - 1) / (1 if o.schedule in ("gpipe", "1f1b") else v),
        pipeline_stages=pp if v == 1 and pp > 1 else 0, traffic=tuple(traffic))
    if not ranks:
        return cost
    # each rank's own memory: its pieces, the micro-batches it holds, the head's logits only where the head is
    return replace(cost, per_rank=tuple(
        replace(cost, piece=state[r], buffers=buffers(params, last), activation_share=share.activations / cp,
                in_flight=flights[r], compute_share=share.compute / cp, output_share=out_share if last else 0.0, traffic=())
        for r, (params, share, last, _) in enumerate(held)))


def rank_shares(model, schedule: str, pp: int, v: int, tp: int) -> list:
    """[(Share, holds the head, its piece indices)] of each pipeline rank, its stages' pieces split by tp
    (cost.pipeline_share's cut); [] without the model's pieces or with one rank."""
    from ddlbench.models.pipeline import partition, stage_owners
    if pp == 1 or len(model.pieces) < pp * v:
        return []
    ranges, owners = partition(len(model.pieces), pp * v), stage_owners(schedule, pp, v)
    mine = [[i for s, r in enumerate(ranges) if owners[s] == rank for i in r] for rank in range(pp)]
    return [(model.share(idx, tp), owners[-1] == rank, idx) for rank, idx in enumerate(mine)]


def inner_parallelisms(o, dims) -> dict:
    """What runs inside the stages beyond FSDP2, as the run records it (native_config): tensor, expert and
    context parallelism (None where off)."""
    return {
        "tensor_parallel": ("ddlbench.models.tensor_parallel plan on every stage" + (
            ", sequence parallel (1/tp of the sequence between stages)" if o.sequence_parallel else "") + (
            ", loss parallel (the head over the vocabulary)" if o.loss_parallel else "")) if dims.tp > 1 else None,
        "expert_parallel": None if o.ep == 1 else {
            "ep": o.ep, "over": "dp_shard (borrowed; FSDP2 of the experts over dp_shard / ep)" if dims.dp_shard > 1
            else "the replicas (dp)", "dispatch": "all_to_all_single (ddlbench.models.moe)",
            "experts_gradient": f"FSDP2 mean over the {dims.dp // o.ep} edp rank(s) holding the same experts, / ep "
            f"{o.ep}" if dims.dp_shard > 1 else
            f"summed over the {dims.dp // o.ep} replica(s) holding the same experts, / dp {dims.dp}"},
        "context_parallel": None if o.cp == 1 else {
            "cp": o.cp, "api": "torch.distributed.tensor.experimental.context_parallel around the schedule's step",
            "load_balancer": "torch's head-tail (2 x cp chunks, causal)",
            "gradients": "FSDP2 over dp_shard x cp (torchtitan's fold: the cp ranks always shard)"},
    }
