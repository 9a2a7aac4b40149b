"""A pipeline's step priced as torch.distributed.pipelining runs it (ddlbench/estimate/scale.py hands
over the pieces' times for a variant whose step rules say `stages`): each stage's forward and backward
per micro-batch and the boundary's sends simulated in the schedule's order (rules.pipeline), then a
tied weight's gradient summed between the first and the last stage, then each stage's data-parallel
reduction (exposed)."""
from __future__ import annotations

import math

from ddlbench.adapters.cost import DTYPE_BYTES
from ddlbench.estimate import rules
from ddlbench.estimate.schedule import POOL, simulate
from ddlbench.estimate.step import layout, pipeline_step, spans
from ddlbench.network.model import Network, collective_time, kind_spans


def whole_link(network: Network, name: str, ways: int) -> Network:
    """`network` with dimension `name`'s link carrying one flow at `ways` x its per-device share
    (a shared link several replicas take turns on)."""
    from dataclasses import replace
    return replace(network, dims=tuple(replace(d, bandwidth=d.bandwidth * ways) if d.name == name and d.shared else d
                                       for d in network.dims))


def stage_pieces(nb: int, pp: int, v: int) -> tuple[list[list[int]], list[list[int]]]:
    """(each rank's pieces, each stage's pieces) of `nb` pieces (embedding, blocks, head): interleaved (v > 1)
    cut as the adapter cuts them (models.pipeline.partition), stage k on rank k mod pp; one stage a rank:
    ceil(blocks / pp) blocks a stage, the embedding with the first, the head with the last."""
    if v > 1:
        from ddlbench.models.pipeline import partition
        virtual = [list(r) for r in partition(nb, pp * v)]
        return [[i for k in range(r, pp * v, pp) for i in virtual[k]] for r in range(pp)], virtual
    per = math.ceil((nb - 2) / pp)
    stages = [list(range(1 + s * per, 1 + min(nb - 2, (s + 1) * per))) for s in range(pp)]
    stages[0].insert(0, 0)
    stages[-1].append(nb - 1)
    return stages, stages


def data_parallel_reduction(pricing, d, cost, grad_b: int, params: float) -> tuple[float, str]:
    """A stage's gradient reduction after the schedule: plain replicas all-reduce them over dp; FSDP2 inside
    the stages (cost.shard_grads) reduce-scatters them over dp_shard (x cp, context parallelism's fold) at the
    last micro-batch's backward and all-reduces the shards over dp_replicate (HSDP). (seconds, the larger part's kind)."""
    ranks = d.dp * d.cp      # context parallelism inside the stages: FSDP2 over dp_shard x cp (torchtitan's fold)
    if not cost.shard_grads or cost.shard_ranks <= 1:
        return pricing.seconds("all_reduce", grad_b * params, ranks, d.tp), pricing.label("all_reduce", ranks, d.tp)
    shard = cost.shard_ranks
    rs = pricing.seconds("reduce_scatter", grad_b * params, shard, d.tp)
    ar = pricing.seconds("all_reduce", grad_b * params / shard, ranks // shard, shard * d.tp) if ranks > shard else 0.0
    return rs + ar, pricing.label("reduce_scatter", shard, d.tp) if rs >= ar else pricing.label("all_reduce", ranks // shard, shard * d.tp)


def pipeline(plan, prof, pricing, times, cost, grad_b: int, comm: dict, ranks_per_core: int = 1,
             extra: list | None = None, tp_kind: str = "tp", experts: list | None = None, ep: int = 1) -> dict:
    """A pipeline (GPipe, 1F1B; interleaved 1F1B with its stages_per_rank): the bubble stated as the ideal
    (pp - 1) / v slots, at most what the schedule idled; the zero-bubble schedules: the busiest stage's slot
    through ddlbench.estimate.step.pipeline_step's flow shop. `extra`: each piece's collectives per
    micro-batch (forward, backward: a block's tensor-parallel ones and a MoE block's all-to-alls, the head's
    under loss parallelism), in its stage's slot and exposed (no async TP). `experts`: each piece's experts'
    parameters, 1/ep of them on a rank (expert parallelism over the replicas, or over dp_shard under FSDP2):
    their gradients all-reduced (FSDP2: reduce-scattered) over the dp / ep ranks that hold the same experts, the
    rest over dp. A boundary's send: the activation in the run's dtype, 1/tp of it under sequence
    parallelism (each tp rank sends its part of the sequence). FSDP2 inside the stages gathers each stage's
    parameters once a schedule, at its first micro-batch (counted, not exposed: every stage but the first waits
    for its input then), and reduce-scatters the gradients after the last (exposed). With fewer micro-batches a
    schedule than a step has (framework.options.n_microbatches) the schedule runs several times a step, each
    with its own fill and drain (gradient accumulation over the pipeline)."""
    from ddlbench.adapters.stages import schedule_microbatches
    d, o = plan.dims, plan.options
    nb, pp = len(prof.pieces), d.pp
    m, repeats = schedule_microbatches(o, d)     # the schedule's micro-batches, run `repeats` times a step
    step_rules = plan.variant.abilities().step
    extra = extra or [(0.0, 0.0)] * nb
    experts = experts or [0.0] * nb
    times = [(f + e[0], b + e[1]) for (f, b), e in zip(times, extra)]
    schedule = getattr(o, "schedule", "1f1b")
    v = getattr(o, "stages_per_rank", 1) if schedule == "interleaved_1f1b" else 1
    stages, virtual = stage_pieces(nb, pp, v)
    stage_s = [(sum(times[i][0] for i in st), sum(times[i][1] for i in st)) for st in stages]
    slot = max(f + b for f, b in stage_s)
    busiest = max(range(pp), key=lambda r: sum(stage_s[r]))
    tp_slot = sum(sum(extra[i]) for i in stages[busiest])        # of the slot: its pieces' collectives
    if tp_slot:
        comm[tp_kind] = comm.get(tp_kind, 0.0) + tp_slot * d.grad_accum
    precision = plan.cfg.run.precision
    boundary = (prof.boundary_bytes_per_sample / 4 * DTYPE_BYTES[precision] * d.micro_batch
                / (d.tp if step_rules.tp_sequence_parallel and d.tp > 1 else 1) / d.cp)
    send, inner = 0.0, d.tp * d.dp * d.cp
    if pp > 1:      # to the next stage: dp x cp x tp ranks further on (pp outermost)
        send = collective_time("send", boundary, kind_spans(pricing.network, "send", spans(pricing.network, pp, inner)),
                               pricing.algorithm)[0]
    local_experts = [sum(experts[i] for i in st) / ep for st in stages]      # 1/ep of each stage's experts on a rank
    dense = [sum(prof.pieces[i].kept_params(d.tp) - experts[i] for i in st) for st in stages]
    stage_params = [n + e for n, e in zip(dense, local_experts)]
    sharded = cost.shard_params and cost.shard_ranks > 1
    edp, e_stride = d.dp // ep, ep * d.tp       # the ranks that hold the same experts, ep x tp apart

    def experts_s(kind: str, nbytes: float) -> float:
        return pricing.seconds(kind, nbytes, edp, e_stride) if nbytes > 0 and edp > 1 else 0.0
    if ep > 1:      # the dense part over dp (FSDP2: dp_shard); the experts over the edp ranks (all-reduce; FSDP2: reduce-scatter)
        reduced = [data_parallel_reduction(pricing, d, cost, grad_b, n) for n in dense]
        reduced = [(s + experts_s("reduce_scatter" if sharded else "all_reduce", grad_b * e), k)
                   for (s, k), e in zip(reduced, local_experts)]
    else:
        reduced = [data_parallel_reduction(pricing, d, cost, grad_b, n) for n in stage_params]
    ar, label = [s for s, _ in reduced], reduced[0][1]
    if sharded:     # FSDP2: each stage's parameters gathered once a schedule (the experts over their edp ranks)
        gather = pricing.label("all_gather", cost.shard_ranks, d.tp)
        comm[gather] = comm.get(gather, 0.0) + repeats * max(
            pricing.seconds("all_gather", DTYPE_BYTES[precision] * n, cost.shard_ranks, d.tp)
            + experts_s("all_gather", DTYPE_BYTES[precision] * e) for n, e in zip(dense, local_experts))
    send_label = pricing.label("send", pp, inner) if pp > 1 else "send"
    comm[label] = comm.get(label, 0.0) + max(ar) * (repeats if sharded else 1)     # FSDP2: once a schedule
    comm[send_label] = comm.get(send_label, 0.0) + 2 * send * d.grad_accum * v
    compute = slot * d.grad_accum
    tied = prof.stage_tied_params(d.tp) if pp > 1 else 0.0
    tied_s, tied_label = 0.0, None
    if tied:        # the first and the last stage sum their copies' gradients, after the schedule
        stride = (pp - 1) * inner
        tied_s = pricing.seconds("all_reduce", grad_b * tied, 2, stride)
        tied_label = pricing.label("all_reduce", 2, stride)
        comm[tied_label] = comm.get(tied_label, 0.0) + tied_s
    if schedule in ("gpipe", "1f1b", "interleaved_1f1b"):
        # ranks sharing a processor: the replicas of a stage on one node (pp outermost: dp x tp ranks
        # a stage) side by side, taking turns on its processor and on the boundary's link, each task
        # at the whole processor's and link's speed, instead of all at a share of it in step
        k = ranks_per_core
        replicas = k if k > 1 and d.tp == 1 and d.cp == 1 and d.dp % k == 0 else 1
        whole = [(sum(times[i][0] for i in st), sum(times[i][1] for i in st)) for st in virtual]
        if replicas > 1:
            whole = [(f / k, b / k) for f, b in whole]
            net = whole_link(pricing.network, send_label.partition("@")[2], k)
            send = collective_time("send", boundary, kind_spans(net, "send", spans(net, pp, inner)), pricing.algorithm)[0]
        tasks = rules.pipeline(whole, m, send, schedule, send_label,
                               (tied_s, tied_label) if tied_s else None, [(a, label) for a in ar], replicas, v)
        dims = pricing.buckets(ranks_per_core)

        def bucket(key: str) -> float:     # '>0' / '<0': a boundary's links; 'node:1': stage 1's dp links
            return dims.get(send_label.partition("@")[2] if key[0] in "<>" else key.split(":")[0], 0.0)
        sched = simulate(tasks, {key: bucket(key) for t in tasks for key in t.links})
        body = max(sched.end[t.name] for t in tasks if t.stream.removeprefix(POOL).startswith("stage"))
        after_tied = max((sched.end[t.name] for t in tasks if t.name.startswith("tied")), default=body)
        step = sched.step_s
    else:
        body = pipeline_step(slot, m, pp, send)
        after_tied = body + tied_s
        step = after_tied + max(ar)
    # several schedules a step: each with its fill and drain; the tied weight's sum and the last reduction
    # once after them (FSDP2's earlier reduce-scatters overlap the next schedule: counted above, not exposed)
    body, after_tied, step = repeats * body, repeats * body + after_tied - body, repeats * body + step - body
    bubble = min(repeats * (pp - 1) * slot / v, max(0.0, body - compute))    # the ideal bubble, never more than idled
    exposed = {"pipeline bubble": bubble, send_label: max(0.0, body - compute - bubble),
               tp_kind: tp_slot * d.grad_accum}
    if tied_label:
        exposed[tied_label] = exposed.get(tied_label, 0.0) + after_tied - body
    exposed[label] = exposed.get(label, 0.0) + step - after_tied
    return {"step_s": step, "compute_s": compute - tp_slot * d.grad_accum,
            "exposed": {k: v for k, v in exposed.items() if v > 1e-12},
            "comm_s": comm, "layout": layout(d, cost, ep)}
