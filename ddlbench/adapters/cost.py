"""What one framework variant costs per optimizer step: the model state and buffers each rank
holds and the collectives it issues. Each adapter declares its own (`Adapter.cost_model`, a
classmethod: no process group, no model built); `bench advise` prices it (ddlbench/estimate/memory.py,
ddlbench/estimate/step.py) and the run record's analytic volume reads its data-parallel payloads
(`CostModel.payload_psi`). Pure data and arithmetic: no torch, hand-checked in
tests/test_cost_model.py.

Vocabulary:
    piece     the parameters of the busiest rank's part of the model, before data-parallel
              sharding (params / (tp x pp) where tensor and pipeline parallelism split it)
    Psi       fp32 bytes of the piece (4 x piece): the unit the ZeRO paper counts volumes in
    unit      what FSDP / ZeRO-3 gather at once: a block (the largest one), or the root
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

MiB = 1 << 20
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Piece:
    """One pipeline piece of the model (ddlbench/models/pipeline.py: embedding | each block | head)."""
    params: int                  # its parameters; a weight tied to another piece's is counted in both
    split_params: int = 0        # of which the tensor-parallel plan shards (ddlbench/models/tensor_parallel.py)
    tied_params: int = 0         # of which are tied to another piece's (GPT-2: wte = lm_head)
    flops: float = 0.0           # forward FLOPs per sample
    activation_bytes: int = 0    # saved for backward per sample (the last piece: with the loss)
    # of `flops`, the (T x T) attention matmuls' (QK^T and the probabilities times V, full T x T)
    attention_flops: float = 0.0
    experts_params: int = 0      # of `params`, its MoE layer's experts' (0: a dense piece)
    # bytes per sample its forward's ops other than matmuls read and write (ddlbench/models/flops.MemoryTraffic):
    # as eager mode runs them, and with each chain of them between two matmuls fused into one kernel
    memory_bytes: float = 0.0
    fused_bytes: float = 0.0

    def moved_bytes(self, kernels: str) -> float:
        """Bytes per sample the other ops move, as `kernels` (eager, fused) runs them; none: 0 (folded in)."""
        return {"eager": self.memory_bytes, "fused": self.fused_bytes, "none": 0.0}[kernels]

    def kept_params(self, tp: int) -> float:
        return self.params - self.split_params + self.split_params / tp

    def kept_flops(self, tp: int) -> float:
        """Compute follows the parameters: a block's matmuls and its heads' attention are split,
        the embedding lookup, norms and an unsplit head are not."""
        return self.flops * (1 - (1 - 1 / tp) * self.split_params / self.params) if self.params else self.flops

    def executed_flops(self, tp: int, causal_skip: float = 0.0) -> float:
        """What the rank's kernels compute of `kept_flops`: a fused causal attention kernel (flash,
        SDPA with is_causal) skips the score blocks above the diagonal, `causal_skip` (0.5) of the
        (T x T) matmuls, which eager attention computes in full and then masks."""
        kept = self.kept_flops(tp)
        return kept * (1 - causal_skip * self.attention_flops / self.flops) if self.flops else kept

    def kept_activations(self, tp: int) -> float:
        """Activations of a split piece divided by tp (norms and residuals, which Megatron keeps
        replicated without sequence parallelism, are counted as split: a lower bound)."""
        return self.activation_bytes / (tp if self.split_params else 1)


@dataclass(frozen=True)
class Share:
    """What a rank holding some of the pieces, split by tp, keeps and computes."""
    params: float           # parameters, a tied weight held twice on the rank counted once
    compute: float          # of one replica's forward FLOPs
    activations: float      # of one replica's activations per sample


def pipeline_share(model, schedule: str, pp: int, v: int, tp: int, flights: list[int] | None = None):
    """The Share of the busiest pipeline rank: its stages' pieces, split by tp (each
    figure the maximum over the ranks); uniform 1 / pp without the model's pieces.
    `flights`: micro-batches each rank holds in flight; activations are then the largest
    share x flight over the ranks, per micro-batch of the most any rank holds."""
    from ddlbench.models.pipeline import partition, stage_owners
    if pp == 1 or len(model.pieces) < pp * v:
        return model.share(range(len(model.pieces)), tp, of=pp)
    ranges, owners = partition(len(model.pieces), pp * v), stage_owners(schedule, pp, v)
    ranks = [model.share([i for s, r in enumerate(ranges) if owners[s] == rank for i in r], tp)
             for rank in range(pp)]
    flights = flights or [1] * pp
    acts = max(r.activations * f for r, f in zip(ranks, flights)) / max(flights)
    return Share(max(r.params for r in ranks), max(r.compute for r in ranks), acts)


@dataclass(frozen=True)
class ModelProfile:
    """What a cost model needs to know about a model (ddlbench.estimate.profile measures it on meta)."""
    params: int
    largest_block_params: int
    blocks: int
    activation_bytes_per_sample: int        # saved for backward, no checkpointing
    checkpointed_bytes_per_sample: int      # saved for backward with every block checkpointed
    boundary_bytes_per_sample: int          # one block's output (pipeline p2p, tensor-parallel all-reduce)
    pieces: tuple = ()                      # Piece, in pipeline order; () = unknown: uniform splits
    largest_weight_params: int = 0          # the largest single parameter tensor (GPT-2: the tied wte)
    output_bytes_per_sample: int = 0        # the model's output (GPT-2: the logits, seq x vocab)
    # the two activation figures with the model in fp32, for frameworks that autocast it (fp32
    # parameters; autocast saves 2-byte copies of matmul inputs, fp32 elsewhere: these bound it
    # from above); 0 = not measured (fp32 runs: the figures above are these)
    autocast_activation_bytes_per_sample: int = 0
    autocast_checkpointed_bytes_per_sample: int = 0
    # Mixture-of-Experts: the experts' parameters (all layers), the MoE layers, and the tokens one
    # sample sends to its experts per MoE layer (seq x top_k x hidden, in the profile's dtype)
    experts_params: int = 0
    moe_layers: int = 0
    routed_bytes_per_sample: int = 0
    # saved for backward with every block under selective_op checkpointing (ddlbench/models/checkpointing.py)
    selective_op_bytes_per_sample: int = 0
    autocast_selective_op_bytes_per_sample: int = 0
    # one layer's (T x T) attention scores per sample where eager attention makes them (backward makes
    # their gradient beside them); 0 under a fused kernel
    attention_scores_bytes_per_sample: int = 0
    hidden_size: int = 0                    # a norm's weight (sequence parallelism sums its gradient over tp)
    attention_heads: int = 0                # query heads and key/value heads (0: unknown; Ulysses' all-to-alls)
    kv_heads: int = 0
    # a tensor-parallel block's layers (its family's plan): each row-wise layer's output is
    # all-reduced in forward, each column-wise layer's input gradient in backward (GPT-2: 2 and 2;
    # Llama's q, k, v, gate and up: 2 and 5); 0 = unknown (2 and 2)
    tp_row_layers: int = 0
    tp_column_layers: int = 0
    # every parameter tensor's elements, ascending (ZeRO-3 keeps those under its persistence
    # threshold whole on every rank); () = unknown
    param_numels: tuple = ()
    # the share of the (T x T) attention matmuls the run's kernel skips: 0.5 for a fused causal
    # kernel (SDPA/flash on a causal LM), 0 for eager attention (computes them all, then masks)
    causal_skip: float = 0.0

    @property
    def fused_attention(self) -> bool:
        """Whether the run's attention is a fused kernel (flash / SDPA: it skips the masked score blocks and
        recomputes the scores in backward); every language model we build is causal, so the skip says so."""
        return self.causal_skip > 0

    def params_at_most(self, numel: int) -> int:
        """Parameters in tensors of at most `numel` elements (0 where the sizes are unknown)."""
        return sum(n for n in self.param_numels if n <= numel)

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks (embeddings, final norm, head): a per-block wrap's root unit."""
        return max(0, self.params - self.blocks * self.largest_block_params)

    def tied_pair_params(self, pp: int, tp: int = 1) -> float:
        """A weight that one rank uses twice (GPT-2's wte as embedding and head): its parameters on
        that rank, or 0 where no rank holds both uses (pipeline stages each hold their own copy)."""
        tied = [p for p in self.pieces if p.tied_params]
        if pp > 1 or len(tied) < 2:
            return 0.0
        return max(p.tied_params * p.kept_params(tp) / p.params for p in tied)

    def stage_tied_params(self, tp: int = 1) -> float:
        """A weight tied across pieces (GPT-2's wte, a tied Llama's embed_tokens), as one copy of it
        at tp (a pipeline's first and last stage each hold one and sum their gradients); 0 untied."""
        return self.tied_pair_params(1, tp)

    def sparse_blocks(self) -> list[bool]:
        """Which blocks hold experts: where the profile counted them per piece (DeepSeek-V3: after its dense
        first layers), else `moe_layers` of them spread evenly (moe_blocks)."""
        body = self.pieces[1:-1]
        if len(body) == self.blocks and any(p.experts_params for p in body):
            return [p.experts_params > 0 for p in body]
        return moe_blocks(self.blocks, self.moe_layers)

    def vocab_split(self) -> "ModelProfile":
        """This profile with its head split by tp over the vocabulary (loss parallelism): the last
        piece's parameters, FLOPs and activations all counted as split (its final norm, one
        hidden-size vector, with them); a tied head cannot be split (refused before)."""
        if not self.pieces or self.pieces[-1].tied_params:
            return self
        head = self.pieces[-1]
        return replace(self, pieces=(*self.pieces[:-1], replace(head, split_params=head.params)))

    def embedding_split(self, tp: int) -> "ModelProfile":
        """This profile with its embedding split by tp over the vocabulary (a pipeline stage's under sequence
        parallelism: torchtitan's row-wise embedding); a tied one stays whole. Where the embedding was the
        largest weight and the head is split too (loss parallelism), the largest a rank makes a gradient of at
        once is at most 1/tp of the embedding or of a block (a block's parameters bound its largest weight)."""
        if not self.pieces or self.pieces[0].tied_params:
            return self
        embed, head = self.pieces[0], self.pieces[-1]
        largest = self.largest_weight_params
        if largest == embed.params and head.split_params == head.params:
            largest = math.ceil(max(embed.params, self.largest_block_params) / tp)
        return replace(self, pieces=(replace(embed, split_params=embed.params), *self.pieces[1:]),
                       largest_weight_params=largest)

    def tp_all_reduces(self) -> tuple[int, int]:
        """A tensor-parallel block's all-reduces without sequence parallelism: (forward, backward)."""
        return (self.tp_row_layers or 2, self.tp_column_layers or 2)

    @property
    def units(self) -> int:
        """Sharded units of a per-block wrap: every block, and the root for the rest."""
        return self.blocks + 1

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        return cls(**{**d, "pieces": tuple(Piece(**p) for p in d.get("pieces", ())),
                      "param_numels": tuple(d.get("param_numels", ()))})

    def to_dict(self) -> dict:
        return asdict(self)

    def share(self, indices, tp: int = 1, of: int = 1) -> Share:
        """A rank holding the pieces `indices`, each split by tp. Without pieces: 1 / of of the
        model's blocks split by tp, the uniform rule (embeddings and head split like the rest)."""
        if not self.pieces:
            return Share(self.params / (tp * of), 1 / (tp * of), 1 / (tp * of))
        mine = [self.pieces[i] for i in sorted(set(indices))]
        tied = [p.tied_params for p in mine if p.tied_params]
        params = sum(p.kept_params(tp) for p in mine) - (sum(tied) - max(tied) if len(tied) > 1 else 0)
        flops = sum(p.flops for p in self.pieces)
        acts = sum(p.activation_bytes for p in self.pieces)
        return Share(params, sum(p.kept_flops(tp) for p in mine) / flops if flops else 1 / (tp * of),
                     sum(p.kept_activations(tp) for p in mine) / acts if acts else 1 / (tp * of))


@dataclass(frozen=True)
class Traffic:
    """`count` messages of `bytes` each per optimizer step (fractional for strategies that
    communicate every k steps), among `ranks` ranks `stride` ranks apart (tp innermost, pp
    outermost: ddlbench.settings.dims.MESH_ORDER)."""
    kind: str            # all_reduce | all_gather | reduce_scatter | reduce | broadcast | send
    bytes: float
    count: float
    ranks: int
    stride: int = 1
    what: str = ""       # gradients | parameters | activations ...
    data_parallel: bool = True   # counted in the run record's analytic volume (model-parallel traffic is not)


@dataclass(frozen=True)
class StepRules:
    """How the predictor lays one step of a variant out as tasks (ddlbench/estimate/scale.py over
    rules.py and schedule.py): the variant's own statement of its step's shape, so the predictor
    branches on these fields and never on a framework's name.

    gradients: 'buckets'  all-reduced in buckets as backward produces them (DDP; DeepSpeed ZeRO-0/1/2,
                          whose 0.19 engine all-reduces its buckets too);
               'units'    parameters all-gathered and gradients reduce-scattered per wrapped unit
                          (FSDP2, ZeRO-3, and FSDP2 under tensor, context and expert parallelism);
               'stages'   pipeline stages exchanging activations point to point, micro-batches in a schedule."""
    gradients: str
    bucket_bytes: float = 0.0              # 'buckets': one bucket's bytes (DDP's bucket_cap_mb), or
    bucket_elements: float = 0.0           # its elements at the gradient dtype (DeepSpeed's reduce_bucket_size)
    gather_after_step: bool = False        # ZeRO-1/2: the updated parameter shards all-gathered after the step
    reduce_every_micro_batch: bool = False  # ZeRO-2: gradients reduced on every micro-batch, not once a step
    sequence: str = "all_to_all"           # how cp ranks share a block's attention: 'ring' (torch's context
                                           # parallelism: k and v gathered, gradients passed round) or
                                           # 'all_to_all' (Ulysses: heads exchanged for sequence)
    grads_over_world: bool = False         # the gradient groups span every rank (cp folded into data parallel)
    experts: bool = False                  # MoE experts over ep ranks: each MoE block's experts a unit of their own
    tp_sequence_parallel: bool = False     # tp > 1 with Megatron's SP: a block's activations all-gathered before
                                           # attention and the MLP and reduce-scattered after them, each way
    vocab_parallel: bool = False           # tp > 1 with loss parallelism: the head split over the vocabulary
                                           # (ModelProfile.vocab_split), its input gradient reduced in backward
    embedding_parallel: bool = False       # tp > 1: an untied embedding split over the vocabulary (embedding_split)

    def __post_init__(self):
        if self.gradients not in ("buckets", "units", "stages"):
            raise ValueError(f"StepRules.gradients: buckets, units or stages (got {self.gradients!r})")


@dataclass(frozen=True)
class CostModel:
    source: str                      # the framework code path (and version) these figures follow
    piece: float                     # parameters of this rank's model piece (before data-parallel sharding)
    shard_ranks: int = 1             # ranks that divide the sharded parts of the model state
    shard_optimizer: bool = False
    shard_grads: bool = False
    shard_params: bool = False
    persistent_params: float = 0.0   # sharded parameters also kept whole on every rank (ZeRO-3's persistence threshold)
    param_bytes: int = 4             # bytes per parameter the rank keeps (DeepSpeed's 2-byte engine: 2)
    grad_bytes: int = 4
    fp32_master_copy: bool = False   # the optimizer keeps fp32 master weights (+4 B/param)
    offload_optimizer: bool = False  # optimizer state (and master copy) in host memory
    offload_params: bool = False     # parameter and gradient shards in host memory
    buffers: dict = field(default_factory=dict)   # {what: bytes} the framework adds on the device
    activation_share: float = 1.0    # of one replica's activations per micro-batch, on the busiest rank
    output_share: float = 1.0        # of the model's output (the logits) a rank makes: 1 / tp under loss parallelism
    in_flight: int = 1               # micro-batches whose activations a rank holds at once
    compute_share: float = 1.0       # of one replica's compute per micro-batch, on the busiest rank
    bubble_slots: float = 0.0        # idle micro-batch slots per step (pipeline fill and drain)
    grads_preallocated: bool = False  # gradients live in storage made before backward (DDP's bucket
                                      # views, grads zeroed in place): a contribution is added into it
    backward_grad_bytes: int = 0      # bytes per element of a gradient as backward makes it, where it
                                      # differs from grad_bytes (FSDP2 mixed precision: param_dtype); 0 = same
    step_grad_copy_bytes: int = 0     # bytes per element of a copy of the gradients that exists only
                                      # during the optimizer step (DeepSpeed's FP16_Optimizer: fp32)
    pipeline_stages: int = 0         # > 1: a one-stage-per-rank pipeline schedule (GPipe, 1F1B) whose
                                     # sends overlap the next micro-batch's compute (estimate.step)
    traffic: tuple = ()              # Traffic, per optimizer step
    largest_weight: float = 0.0      # the largest weight a rank holds whole, where the layout splits the model's
                                     # largest (ModelProfile.embedding_split); 0: the model's largest_weight_params
    # ranks that hold different parts of the model (a pipeline's): each one's own cost model; memory is then
    # the largest of their totals (estimate.memory.estimate), not the sum of each part's largest
    per_rank: tuple = ()

    def state_bytes(self, optimizer: str, momentum: float = 0.0) -> dict[str, float]:
        """Parameters, gradients and optimizer state on the busiest rank, wherever they live (the
        ZeRO paper's model states, section 3): its piece at the bytes the framework keeps, each part
        divided by the ranks that shard it."""
        from ddlbench.metrics.memory import optimizer_state_bytes_per_param
        n = max(self.shard_ranks, 1)
        k = optimizer_state_bytes_per_param(optimizer, momentum, fp32_master_copy=self.fp32_master_copy)
        params = self.piece / n + self.persistent_params if self.shard_params else self.piece
        return {"params": self.param_bytes * params,
                "grads": self.grad_bytes * self.piece / (n if self.shard_grads else 1),
                "optimizer": k * self.piece / (n if self.shard_optimizer else 1)}

    @property
    def autocast(self) -> bool:
        """torch.autocast runs the model at 2 bytes over fp32 parameters (its weight copies are
        among the buffers): activations are then mixed, not all in the training dtype."""
        return AUTOCAST_COPIES in self.buffers

    def payload_psi(self) -> dict[str, float]:
        """Data-parallel payload per step per collective kind, in units of Psi."""
        psi = 4.0 * self.piece
        out: dict[str, float] = {}
        for t in self.traffic:
            if t.data_parallel and t.count and psi:
                out[t.kind] = out.get(t.kind, 0.0) + t.bytes * t.count / psi
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(**{**d, "traffic": tuple(Traffic(**t) for t in d.get("traffic", ())),
                      "per_rank": tuple(cls.from_dict(c) for c in d.get("per_rank", ()))})


def split(kind: str, payload: float, messages: int, ranks: int, stride: int = 1, per_step: float = 1.0,
          what: str = "", data_parallel: bool = True) -> list[Traffic]:
    """A payload sent as `messages` equal messages, `per_step` times per optimizer step; nothing
    where the group has one member or there is no payload."""
    if ranks <= 1 or payload <= 0 or per_step <= 0:
        return []
    messages = max(1, messages)
    return [Traffic(kind, payload / messages, messages * per_step, ranks, stride, what, data_parallel)]


def buckets(payload: float, bucket_bytes: Optional[float]) -> int:
    """Messages of a payload cut into buckets of at most `bucket_bytes` (None or 0: one message)."""
    return max(1, math.ceil(payload / bucket_bytes)) if bucket_bytes else 1


def low(precision: str) -> bool:
    return precision in ("bf16", "fp16")


AUTOCAST_COPIES = "autocast weight copies"


def autocast_copies(piece: float, precision: str) -> dict:
    """torch.autocast caches a 2-byte copy of every weight it casts (fp32 parameters kept)."""
    return {AUTOCAST_COPIES: 2.0 * piece} if low(precision) else {}


def moe_blocks(blocks: int, moe_layers: int) -> list[bool]:
    """Which of `blocks` blocks are sparse when `moe_layers` of them are, spread evenly (every one
    where all are; Qwen-MoE's decoder_sparse_step 2: every second)."""
    return [True] * blocks if moe_layers >= blocks else [(i + 1) * moe_layers // blocks > i * moe_layers // blocks for i in range(blocks)]
