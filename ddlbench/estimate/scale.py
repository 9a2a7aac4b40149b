"""A layout priced at world sizes it never ran at, from a specification (`bench project
model=... framework=... network=...`): for each world size the configuration is planned as a
run would be (ddlbench.planning.config: the same overrides, the same validation, the layout the record
would state), the model's pieces are timed by a roofline (the hardware's peak x an efficiency:
stated with `mfu=`, or solved so that a measured point — `calibrate=TOKENS_PER_S@DEVICES`, tokens
per second per device — is reproduced), each unit's collectives are priced on the network over the
mesh dimensions their groups span, and the step is simulated as a schedule with the framework's
rules (ddlbench/estimate/rules.py, ddlbench/estimate/schedule.py). Memory per rank is the
estimator's (ddlbench/estimate/memory.py) for the planned layout.

Compute per piece (embedding, each block, the head with the loss) per micro-batch:
    forward  = (FLOPs(piece, tp-split) + ridge x bytes(piece, tp-split)) x micro_batch / (peak x efficiency)
               (bytes: what its other ops move as the stack runs them, `kernels=eager|fused`, ridge = peak / the
               memory's bytes/s; none by default; the attention's T x T matmuls at their kernel's rate where given)
    backward = 2 x forward + recompute x forward (blocks; ac: none 0, full 1, selective_layer:K 1
               on every K-th block, selective_op 0.5 — torchtitan's per-op policy recomputes every
               other matmul)
The optimizer's step: priced where timed (calibrate=pieces: s per parameter x the busiest rank's, after the
schedule), else folded into the efficiency. Not priced: kernel launch gaps, stragglers, congestion."""
from __future__ import annotations

from dataclasses import dataclass

from ddlbench.adapters.cost import DTYPE_BYTES, moe_blocks
from ddlbench.errors import ConfigError
from ddlbench.estimate import rules
from ddlbench.estimate.schedule import simulate
from ddlbench.estimate.step import layout, spans
from ddlbench.network.model import Network, collective_time, kind_spans


def recompute(policy: str, block: int) -> float:
    """Forwards of block `block` (from 0) run again in backward under an activation checkpointing
    policy: full 1, selective_layer:K 1 on every K-th block, selective_op 0.5 (torchtitan's
    per-op policy recomputes every second matmul and keeps attention), none 0."""
    from ddlbench.models.checkpointing import layer_every, normalize
    policy = normalize(policy)
    if policy == "selective_op":
        return 0.5
    k = layer_every(policy)
    return 1.0 if k and (block + 1) % k == 0 else 0.0


# a fused attention kernel's backward (flash, SDPA's efficient and cuDNN kernels) computes five (T x T) matmuls
# where its forward computes two: it recomputes the scores from Q and K rather than keep them (FlashAttention-2,
# Dao 2023, section 3.1.2); eager attention keeps the probabilities and computes four, twice its forward
FUSED_ATTENTION_BACKWARD = 2.5


def block_backward(linear_s: float, attention_s: float, fused: bool, policy: str, block: int) -> float:
    """Seconds of one block's backward from its forward's linear and (T x T) attention seconds: twice the
    linear ones, the attention's 2.5 times under a fused kernel (twice under eager attention), plus what the
    checkpointing policy runs again of the forward (selective_op: half of the linear layers, the attention
    kept); `block` < 0 is a piece outside the blocks (embedding, head), never checkpointed."""
    back = 2 * linear_s + (FUSED_ATTENTION_BACKWARD if fused else 2.0) * attention_s
    if block < 0:
        return back
    from ddlbench.models.checkpointing import normalize
    again = recompute(policy, block)
    return back + again * (linear_s if normalize(policy) == "selective_op" else linear_s + attention_s)


@dataclass(frozen=True)
class Pricing:
    network: Network
    algorithm: str = "best"
    dispatch: str = "all_to_all"        # how expert parallelism sends tokens (ddlbench/estimate/dispatch.py)
    routing: str = "uniform"            # where the router sends them

    def seconds(self, kind: str, nbytes: float, ranks: int, stride: int) -> float:
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        s = spans(self.network, ranks, stride)
        return collective_time(kind, nbytes, kind_spans(self.network, kind, s, nbytes), self.algorithm)[0]

    def dispatch_seconds(self, routed_bytes: float, ranks: int, stride: int, experts: int, top_k: int) -> float:
        """One expert-parallel dispatch of `routed_bytes` (a token's top_k copies) per rank over `ranks`
        ranks `stride` apart: an all_to_all of them, or DeepEP's per-rank / per-node copies."""
        if self.dispatch == "all_to_all" or ranks <= 1:
            return self.seconds("all_to_all", routed_bytes, ranks, stride)
        from ddlbench.estimate import dispatch
        s = kind_spans(self.network, "all_to_all", spans(self.network, ranks, stride), routed_bytes)
        return dispatch.seconds(routed_bytes / top_k, s, experts, top_k, self.dispatch, self.routing)

    def buckets(self, ranks_per_core: int = 1) -> dict[str, float]:
        """{dimension: its links' token bucket in seconds} for the shaped dimensions (burst_bytes > 0:
        `bench cluster`'s tbf; none on a real network): the burst over the link's whole rate (a shared
        link's `bandwidth` is each device's share of it). With a node's ranks sharing one core
        (ranks_per_core > 1) the innermost dimension's collectives get none: measured
        (benchmarks/tbf_probe.py --inside-node, reports/network/tbf-probe/inside-node/), an
        all-reduce between a node's two devices after 10 ms of compute runs at the line or slower
        (512 KiB: 22.2 ms, the line 21.9), where one between two nodes saves the whole bucket."""
        out, below = {}, 1
        for i, d in enumerate(self.network.dims):
            if d.burst_bytes > 0 and not (i == 0 and ranks_per_core > 1):
                out[d.name] = d.burst_bytes / (d.bandwidth * (below if d.shared else 1))
            below *= d.size
        return out

    def label(self, kind: str, ranks: int, stride: int) -> str:
        """'all_gather@leaf': the kind and the outermost network dimension its group spans."""
        crossing = [d.name for n, d in spans(self.network, ranks, stride) if n > 1] or [self.network.dims[0].name]
        return f"{kind}@{crossing[-1]}"


def piece_times(prof, tp: int, micro_batch: int, flops_per_s: float, ac: str,
                measured: list[tuple[float, float]] | None = None,
                attention_flops_per_s: float | None = None, ridge: float = 0.0,
                kernels: str = "none") -> list[tuple[float, float]]:
    """(forward, backward) seconds per micro-batch of every piece (embedding, blocks, head): by the
    roofline (the forward FLOPs the rank's kernels compute / flops_per_s, backward by block_backward; a
    fused causal attention kernel computes half of the T x T scores: Piece.executed_flops; with
    `attention_flops_per_s` those T x T matmuls at their own rate: Float8 speeds only the linear
    layers; with `ridge`, the device's peak FLOP/s over its memory's bytes/s, the bytes the other ops move
    as `kernels` runs them (Piece.moved_bytes: eager or fused) priced as `ridge` FLOPs each — at the memory's
    rate x the same efficiency, split by tp like the piece's FLOPs, its backward moving twice its forward's
    and recomputed with it, as the linear layers), or from `measured` seconds per sample of each piece
    (ddlbench/project/piece_timer.py) times the layout's share of its FLOPs."""
    out = []
    n, skip = len(prof.pieces), prof.causal_skip
    for i, p in enumerate(prof.pieces):
        block = 0 < i < n - 1
        if measured:
            share = p.executed_flops(tp, skip) / p.executed_flops(1, skip) if p.flops else 1.0
            f, b = (t * micro_batch * share for t in measured[i])
            b += recompute(ac, i - 1) * f if block else 0.0
        else:
            executed = p.executed_flops(tp, skip)
            # the T x T matmuls of the executed FLOPs (a piece's share of them split by tp like the rest)
            attn = p.attention_flops * (1 - skip) * executed / p.executed_flops(1, skip) if p.attention_flops else 0.0
            moved = ridge * p.moved_bytes(kernels) * (executed / p.executed_flops(1, skip) if p.flops else 1.0)
            lin_s = (executed - attn + moved) / flops_per_s * micro_batch
            attn_s = attn / (attention_flops_per_s or flops_per_s) * micro_batch
            f, b = lin_s + attn_s, block_backward(lin_s, attn_s, prof.fused_attention, ac, i - 1 if block else -1)
        out.append((f, b))
    return out


def piece_params(prof, tp: int) -> list[float]:
    """Each piece's parameters on a rank that holds every piece (no pipeline): a weight tied across
    pieces (GPT-2's wte as embedding and head, a tied Llama's embed_tokens) counted once, in the first
    piece that uses it — the embedding, whose backward comes last: DDP's reducer marks the weight
    ready only then, FSDP2's root unit holds it once, and its gradient is all-reduced or
    reduce-scattered once (the profile counts it in every piece that uses it)."""
    out, seen = [], False
    for p in prof.pieces:
        kept = p.kept_params(tp)
        if p.tied_params and seen:
            kept -= p.tied_params * kept / p.params
        seen = seen or bool(p.tied_params)
        out.append(kept)
    return out


def step_of(plan, prof, pricing: Pricing, flops_per_s: float, ac: str, per_node: int,
            measured: list[tuple[float, float]] | None = None, optimizer_s_per_param: float | None = None,
            ranks_per_core: int = 1, attention_flops_per_s: float | None = None, ridge: float = 0.0,
            kernels: str = "none") -> dict:
    """One step of the planned layout: {'step_s', 'compute_s', 'exposed': {kind: s}, 'comm_s': {kind: s}}; with a
    measured optimizer (seconds per parameter stepped: calibrate=pieces) its step after the schedule,
    `optimizer_s`, in step_s and compute_s (it waits for every gradient; nothing overlaps it).
    ranks_per_core > 1: a node's ranks share one processor (`bench cluster` on a small host), the
    compute given is each rank's with the processor shared; a pipeline's replicas on a node are then
    simulated side by side (ddlbench/estimate/pipeline.py)."""
    out = _step(plan, prof, pricing, flops_per_s, ac, per_node, measured, ranks_per_core, attention_flops_per_s, ridge,
                kernels)
    if optimizer_s_per_param:
        from ddlbench.estimate.memcheck import cost_of_plan
        cost = cost_of_plan(plan, prof, per_node)
        stepped = cost.piece / (max(cost.shard_ranks, 1) if cost.shard_optimizer else 1)
        opt = optimizer_s_per_param * stepped
        out = {**out, "step_s": out["step_s"] + opt, "compute_s": out["compute_s"] + opt, "optimizer_s": opt}
    return out


def _step(plan, prof, pricing: Pricing, flops_per_s: float, ac: str, per_node: int,
          measured: list[tuple[float, float]] | None = None, ranks_per_core: int = 1,
          attention_flops_per_s: float | None = None, ridge: float = 0.0, kernels: str = "none") -> dict:
    from ddlbench.estimate.memcheck import cost_of_plan
    cfg, d = plan.cfg, plan.dims
    fw, o = cfg.framework.name, plan.options
    precision = cfg.run.precision
    step = plan.variant.abilities().step       # the variant's own statement of its step's shape
    if step is None:
        raise ConfigError(f"bench project: no schedule rules for {fw} yet (its abilities' step)")
    cost = cost_of_plan(plan, prof, per_node)
    prof = prof.vocab_split() if step.vocab_parallel and d.tp > 1 else prof     # loss parallelism: the head split too
    prof = prof.embedding_split(d.tp) if step.embedding_parallel and d.tp > 1 else prof
    gather_b = DTYPE_BYTES[precision]
    grad_b = DTYPE_BYTES[plan.variant.grad_reduce_dtype(precision)]
    tp, mb, m, sp = d.tp, d.micro_batch, d.grad_accum, d.cp
    # Ulysses: each rank computes 1/sp of every sequence (its attention: the whole sequence, 1/sp of the heads)
    times = [(f / sp, b / sp) for f, b in piece_times(prof, tp, mb, flops_per_s, ac, measured, attention_flops_per_s,
                                                              ridge, kernels)]
    nb = len(prof.pieces)
    # a block's all-reduces among the tp ranks: its row-wise outputs in forward, column-wise inputs' gradients in
    # backward, at the activations' dtype (the profile's boundary is counted at 4 bytes an element)
    act = prof.boundary_bytes_per_sample * mb / 4 * DTYPE_BYTES[precision] / (sp if step.sequence == "ring" else 1)
    one_ar = pricing.seconds("all_reduce", act, tp, 1) if tp > 1 else 0.0
    tp_f, tp_b = (n * one_ar for n in prof.tp_all_reduces())
    tp_kind = pricing.label("all_reduce", tp, 1) if tp > 1 else "tp"
    if tp > 1 and step.tp_sequence_parallel:   # Megatron SP: an all-gather before attention and the MLP and a
        # reduce-scatter after each, mirrored in backward (q, k, v share one gathered input: one reduce-scatter)
        tp_f = tp_b = 2 * (pricing.seconds("all_gather", act, tp, 1) + pricing.seconds("reduce_scatter", act, tp, 1))
        tp_kind = pricing.label("all_gather", tp, 1)
    kv = prof.kv_heads / prof.attention_heads if prof.attention_heads else 1.0
    if sp > 1 and step.sequence == "ring":   # ring attention: the cp ranks' k and v (1/tp of the heads) gathered in
        part = prof.boundary_bytes_per_sample * mb / 4 / sp * 2 * kv / tp   # forward and backward, their fp32 gradients
        gathered = pricing.seconds("all_gather", part * DTYPE_BYTES[precision] * sp, sp, tp)     # passed cp times
        # each pass a ring step: torch's _AllToAllRotater permutes the whole buffer to the next cp rank
        # (functional_collectives.permute_tensor: an all_to_all_single with every element to one peer);
        # with tensor parallelism inside pipeline stages beside TP's own collectives (on 1/cp of the sequence)
        tp_f, tp_b = tp_f + gathered, tp_b + gathered + sp * pricing.seconds("send", part * 4.0, sp, tp)
        tp_kind = tp_kind if tp > 1 else pricing.label("all_gather", sp, tp)
    elif sp > 1:    # Ulysses: four all-to-alls a block each way (q, k, v in; the output back), exposed like TP's
        part = prof.boundary_bytes_per_sample * mb / 4 * DTYPE_BYTES[precision] / sp
        tp_f = tp_b = 2 * (pricing.seconds("all_to_all", part, sp, tp) + pricing.seconds("all_to_all", part * kv, sp, tp))
        tp_kind = pricing.label("all_to_all", sp, tp)
    names = ["embedding"] + [f"block{i}" for i in range(nb - 2)] + ["head"]
    comm: dict[str, float] = {}

    params = piece_params(prof, tp)
    ep = int(getattr(o, "ep", 1)) if step.experts else 1
    moe = (prof.sparse_blocks() if nb - 2 == prof.blocks else moe_blocks(nb - 2, prof.moe_layers)) if step.experts \
        else [False] * (nb - 2)
    layer_experts = prof.experts_params / max(prof.moe_layers, 1)
    # expert parallelism (ddlbench/models/moe.py dispatch_combine): in forward a MoE block exchanges
    # its tokens' counts per expert, then sends the routed tokens to their experts and back; in
    # backward their gradients the same two ways (all-to-alls among the ep ranks, tp apart), exposed
    a2a = counts = 0.0
    if ep > 1:      # the routed tokens as the pricing's dispatcher sends them (ddlbench/estimate/dispatch.py)
        experts, top_k = cfg.model.moe.num_experts, cfg.model.moe.top_k
        a2a = pricing.dispatch_seconds(prof.routed_bytes_per_sample * mb, ep, tp, experts, top_k)
        counts = pricing.seconds("all_to_all", 8 * experts, ep, tp)     # int64 each
        tp_kind = pricing.label("all_to_all", ep, tp)

    head_f = head_b = 0.0       # loss parallelism: the cross-entropy's 3 fp32 values a position; the head's input gradient
    if step.vocab_parallel and tp > 1:
        positions = prof.boundary_bytes_per_sample / 4 / max(prof.hidden_size, 1) * mb      # tokens a micro-batch
        head_f = 3 * pricing.seconds("all_reduce", 4.0 * positions, tp, 1)
        head_b = pricing.seconds("reduce_scatter" if step.tp_sequence_parallel else "all_reduce", act, tp, 1)

    def piece(i):
        unit = names[i] if 0 < i < nb - 1 else "root"
        block = 0 < i < nb - 1
        sparse = block and moe[i - 1]
        head = (head_f, head_b) if i == nb - 1 else (0.0, 0.0)
        return rules.Piece(names[i], unit, *times[i], params=params[i],
                           tp_forward_s=tp_f + (counts + 2 * a2a if sparse else 0.0) if block else head[0],
                           tp_backward_s=tp_b + (2 * a2a if sparse else 0.0) if block else head[1])

    def add(kind, s, count=1):
        comm[kind] = comm.get(kind, 0.0) + s * count

    if step.gradients == "stages":   # each stage's pieces run their collectives (TP's, EP's, the loss's), exposed
        from ddlbench.estimate.pipeline import pipeline
        extra = [(0.0, 0.0)] + [(p.tp_forward_s, p.tp_backward_s) for p in map(piece, range(1, nb))]
        experts = [layer_experts if 0 < i < nb - 1 and moe[i - 1] else 0.0 for i in range(nb)]
        return pipeline(plan, prof, pricing, times, cost, grad_b, comm, ranks_per_core, extra, tp_kind, experts, ep)
    pieces = [piece(i) for i in range(nb)]
    if tp > 1 or sp > 1:
        add(pricing.label("all_reduce", tp, 1) if ep > 1 else tp_kind, ((tp_f + tp_b) * (nb - 2) + head_f + head_b) * m)
    if a2a:
        add(tp_kind, (counts + 4 * a2a) * sum(moe) * m)
    # DeepSpeed with the sequence-parallel groups reduces over every rank of the replica and the replicas;
    # context parallelism's FSDP2 shards over dp_shard x cp
    dp_ranks, stride = (d.world_size, 1) if step.grads_over_world else (d.dp, tp)
    if step.gradients == "units":
        shard = cost.shard_ranks
        reshard = bool(getattr(o, "reshard_after_forward", True))
        kinds = {"gather": pricing.label("all_gather", shard, stride),
                 "scatter": pricing.label("reduce_scatter", shard, stride),
                 "reduce": pricing.label("all_reduce", dp_ranks // shard, shard * stride)}
        units = []
        for u in dict.fromkeys(p.unit for p in pieces):
            params = sum(p.params for p in pieces if p.unit == u)
            # expert parallelism: a MoE block's experts are a unit of their own, 1/ep of them on a rank,
            # sharded over the dp_shard / ep ranks that hold the same experts (ep x tp apart)
            experts = layer_experts if step.experts and u.startswith("block") and moe[int(u[5:])] else 0.0
            params -= experts
            efsdp, e_stride = max(shard // ep, 1), ep * stride
            g = (pricing.seconds("all_gather", gather_b * params, shard, stride)
                 + pricing.seconds("all_gather", gather_b * experts / ep, efsdp, e_stride))
            rs = (pricing.seconds("reduce_scatter", grad_b * params, shard, stride)
                  + pricing.seconds("reduce_scatter", grad_b * experts / ep, efsdp, e_stride))
            ar = pricing.seconds("all_reduce", grad_b * params / shard, dp_ranks // shard, shard * stride)
            root = u == "root"
            units.append(rules.Unit(u, g, rs, ar, resharded=reshard and not root))
            add(kinds["gather"], g, m * (2 if reshard and not root else 1) if shard > 1 else 0)
            add(kinds["scatter"], rs), add(kinds["reduce"], ar)
        # CPU: FSDP2's streams are the current one, its collectives block (rules.fsdp_blocking)
        tasks = rules.fsdp(pieces, units, m, 0.0, kinds, tp_kind, blocking=cfg.run.device == "cpu")
    else:                          # buckets: DDP's; DeepSpeed 0.19's ZeRO-1/2 all-reduce theirs too (its cost model)
        kind = "all_reduce"
        label = pricing.label(kind, dp_ranks, stride)
        bs = [(name, pricing.seconds(kind, b, dp_ranks, stride))
              for name, b in rules.buckets(pieces, grad_b, step.bucket_bytes or step.bucket_elements * grad_b)]
        add(label, sum(s for _, s in bs))
        after = None
        if step.gather_after_step and dp_ranks > 1 and cost.shard_optimizer:
            ag_label = pricing.label("all_gather", dp_ranks, stride)
            ag = pricing.seconds("all_gather", DTYPE_BYTES[precision] * sum(p.params for p in pieces), dp_ranks, stride)
            after = (ag, ag_label)
            add(ag_label, ag)
        every = step.reduce_every_micro_batch          # ZeRO-2 reduces on every micro-step
        if every:
            add(label, sum(s for _, s in bs) * (m - 1))
        tasks = rules.bucketed(pieces, bs, m, 0.0, label, "grad", after, tp_kind, every_micro_batch=every)
    s = simulate(on_links(tasks), pricing.buckets(ranks_per_core))
    return {"step_s": s.step_s, "compute_s": s.busy["compute"], "exposed": s.exposed, "comm_s": comm,
            "layout": layout(d, cost, ep)}


def on_links(tasks: list) -> list:
    """Each communication task on the links of the dimension its kind names ('all_gather@link':
    the links of `link`), whose token bucket (if shaped) it draws on; the schedule's view is one
    rank's, and its collectives use both directions of its links alike, so one bucket a dimension;
    an all-gather or an all-to-all sends one message each way at once (schedule.Task.both_ways)."""
    import dataclasses
    return [dataclasses.replace(t, links=(t.kind.partition("@")[2],), both_ways=t.kind.startswith(("all_gather", "all_to_all")))
            if "@" in t.kind and not t.links else t for t in tasks]


def schedule_step(plan, prof, pricing: Pricing, compute_s: float, ac: str, per_node: int) -> dict | None:
    """The planned step through the schedule with its compute given (a calibration's: advise's
    1-rank runs) instead of the roofline's: the rate solved so that the simulated compute stream
    holds `compute_s`. None for a family without rules here (pipelines keep step.py's flow shop)."""
    step = plan.variant.abilities().step
    if step is None or step.gradients == "stages" or compute_s <= 0:
        return None
    probe = step_of(plan, prof, pricing, 1e12, ac, per_node)
    if probe["compute_s"] <= 0:
        return None
    return step_of(plan, prof, pricing, 1e12 * probe["compute_s"] / compute_s, ac, per_node)
