"""Tensor parallelism (DTensor, Megatron-style plan: ddlbench/models/tensor_parallel.py), optionally
x FSDP2 over the data-parallel ranks (2-D, torchtitan's layout) on one named DeviceMesh
("pp", "dp_replicate", "dp_shard", "tp"; tp innermost = adjacent ranks).

Order of application (fixed, as torchtitan): tensor parallel plan -> activation checkpointing
(optional, per block) -> FSDP2 `fully_shard` per block and at the root over the "dp_shard"
sub-mesh. Precision: fp32, or bf16 through autocast (pure TP) / FSDP2's MixedPrecisionPolicy
(with dp_shard > 1).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from ddlbench.adapters.base import StepOut, Strategy
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, forward_backward, fsdp2_no_sync
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, StepRules, autocast_copies, split
from ddlbench.adapters.parallelize import apply_checkpointing, apply_fully_shard, apply_tensor_parallel
from ddlbench.adapters.precision import FrameworkCast
from ddlbench.adapters.variant import Abilities, Variant, taxonomy_labels
from ddlbench.errors import ConfigError
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac
from ddlbench.settings.dims import ParallelSize, model_fit_errors


def loss_parallel():
    from torch.distributed.tensor.parallel import loss_parallel as context
    return context()


class TPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    tp: ParallelSize = -1           # tensor-parallel ranks; -1 = world / dp_shard
    dp_shard: ParallelSize = 1      # FSDP2 shard ranks (2-D); -1 = world / tp
    activation_checkpointing: Policy = "none"   # none | full | selective_layer:K | selective_op (models/checkpointing.py)
    sequence_parallel: bool = False   # Megatron's SP: norms on sequence parts, all-gather + reduce-scatter
    loss_parallel: bool = False       # torchtitan's: the LM head over the vocabulary, the loss on its shards


class TensorParallel(Variant):
    name = "tensor_parallel"
    Options = TPOptions
    strategy = "ddlbench.adapters.tensor_parallel:TensorParallelStrategy"

    def abilities(self):      # FSDP2 over dp_shard around the tensor-parallel blocks
        return Abilities(builds_on_meta=True, step=StepRules("units", tp_sequence_parallel=self.options.sequence_parallel,
                                                             vocab_parallel=self.options.loss_parallel),
                         checkpoints=DCP)

    def taxonomy(self) -> dict:
        sharded = self.options.dp_shard != 1
        return taxonomy_labels("tensor" + (" + data (sharded)" if sharded else ""), "sync",
                               "all-reduce (activations)" + (" + all-gather + reduce-scatter" if sharded else ""),
                               "weights by tensor rank" + (" + FSDP2 over data ranks" if sharded else ""))

    def parallel_shape(self, cfg) -> dict:
        return {"tp": self.options.tp, "dp_shard": self.options.dp_shard, "dp_replicate": 1}

    def cost_model(self, dims, model, precision, per_node=None):
        """Megatron-style blocks: each row-wise layer's output all-reduced in forward and each
        column-wise layer's input gradient in backward (DTensor reduces each layer's Partial gradient
        on its own: GPT-2's fused c_attn and c_fc 2, Llama's q, k, v, gate, up 5; ModelProfile
        .tp_all_reduces), per micro-batch among the tp ranks (adjacent), in the activations' dtype (with
        sequence parallelism each an all-gather and a reduce-scatter of the same size). With
        dp_shard > 1, FSDP2 over each tp slice: all-gathers in forward and backward per micro-batch
        (bf16 param_dtype), one reduce-scatter in fp32, tp ranks apart; two units gathered. Pure TP
        at bf16 runs under autocast (its cached weight copies). Only the blocks are split (the
        plan's layers): embeddings, norms and the head stay whole on every tp rank, in memory and
        in compute (ModelProfile.share), unless loss parallelism splits the head over the vocabulary:
        then its input's gradient is all-reduced (reduce-scattered under SP) in backward, and three
        fp32 values a position (max, sum of exponentials, target logit) in forward."""
        tp, shard, m = dims.tp, dims.dp_shard, dims.grad_accum
        lp = self.options.loss_parallel and tp > 1
        if lp:
            model = model.vocab_split()
        mine = model.share(range(len(model.pieces)), tp)
        piece = mine.params
        gather = DTYPE_BYTES[precision]
        act = model.boundary_bytes_per_sample * dims.micro_batch / 4 * gather
        if self.options.sequence_parallel:
            # each all-reduce an all-gather + a reduce-scatter (forward and backward mirror each
            # other); and the head's input gathered in forward, the first block's input gradient
            # in backward (the head's input gradient is the same on every rank: cut, not reduced)
            # the norms' weights see parts of the sequence: their gradients summed over tp once a step
            # (two a block and the final norm's; sum_partial_grads, or FSDP2's reduction)
            model_parallel = (split("all_gather", act, 1, tp, per_step=(4 * model.blocks + 2) * m,
                                    what="sequence parts", data_parallel=False)
                              + split("reduce_scatter", act, 1, tp, per_step=4 * model.blocks * m,
                                      what="sequence parts", data_parallel=False)
                              + split("all_reduce", 4.0 * model.hidden_size, 1, tp, per_step=2 * model.blocks + 1,
                                      what="norm gradients", data_parallel=False))
        else:
            model_parallel = split("all_reduce", act, 1, tp, per_step=sum(model.tp_all_reduces()) * model.blocks * m,
                                   what="block outputs and input gradients", data_parallel=False)
        if lp:
            positions = model.boundary_bytes_per_sample / 4 / max(model.hidden_size, 1) * dims.micro_batch
            model_parallel += (split("reduce_scatter" if self.options.sequence_parallel else "all_reduce", act, 1, tp,
                                     per_step=m, what="the head's input gradient", data_parallel=False)
                               + split("all_reduce", 4.0 * positions, 1, tp, per_step=3 * m,
                                       what="cross-entropy over vocabulary shards", data_parallel=False))
        traffic = (model_parallel
                   + split("all_gather", gather * piece, model.units, shard, stride=tp, per_step=2 * m,
                           what="parameters")
                   + split("reduce_scatter", 4.0 * piece, model.units, shard, stride=tp, what="gradients"))
        buffers = ({"two units gathered (prefetch), with their gradients": 2 * 2 * gather * model.largest_block_params / tp}
                   if shard > 1 else autocast_copies(piece, precision))
        return CostModel(f"DTensor tensor parallel (tp {tp})" + (f" + FSDP2 over {shard}" if shard > 1 else ""),
                         piece, shard_ranks=shard, shard_optimizer=True, shard_grads=True, shard_params=True,
                         buffers=buffers, activation_share=mine.activations, compute_share=mine.compute,
                         output_share=1 / tp if lp else 1.0, traffic=tuple(traffic))

    def advise_options(self, devices: int) -> list[dict]:
        """Every tp > 1 that divides the ranks, FSDP2 over the rest."""
        return [{"tp": t, "dp_shard": devices // t} for t in range(2, devices + 1) if devices % t == 0]

    def check_config(self, cfg, dims) -> None:
        errors = model_fit_errors(dims, cfg.model, 1)
        if self.options.sequence_parallel:
            errors += sequence_parallel_errors(cfg.model, dims.tp)
        if self.options.loss_parallel:
            errors += loss_parallel_config_errors(cfg.model, dims.tp)
        if errors:
            raise ConfigError("; ".join(errors))

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if cfg.run.precision == "fp16":
            return "tensor-parallel adapter runs fp32 and bf16 (fp16 needs a sharded GradScaler, not wired)"
        return super().unsupported_reason(cfg, device_type)


def sequence_parallel_errors(mc, tp: int) -> list[str]:
    """Why sequence parallelism cannot run as asked (empty: it can)."""
    from ddlbench.models import family
    if tp < 2:
        return [f"framework.options.sequence_parallel needs tensor parallelism (tp > 1), got tp = {tp}"]
    plan = family.of_config(mc).tensor_parallel
    if plan is None or plan.sequence_parallel is None:
        have = [n for n in family.names() if family.get(n).tensor_parallel is not None
                and family.get(n).tensor_parallel.sequence_parallel is not None]
        return [f"sequence parallelism has no plan for model family {getattr(mc, 'family', mc.kind)!r} "
                f"(families with one: {', '.join(have)})"]
    seq = getattr(mc, "seq_len", None)
    if seq and seq % tp:
        return [f"model.seq_len = {seq} is not divisible by tp = {tp} (sequence parallelism splits the sequence)"]
    return []


def loss_parallel_config_errors(mc, tp: int) -> list[str]:
    """Why loss parallelism cannot run as asked, from the configuration (the built model is checked
    too: ddlbench/models/tensor_parallel.loss_parallel_errors)."""
    if tp < 2:
        return [f"framework.options.loss_parallel needs tensor parallelism (tp > 1), got tp = {tp}"]
    if mc.kind != "language":
        return [f"framework.options.loss_parallel needs a language model (its LM head over the vocabulary), got {mc.kind}"]
    from ddlbench.models import family
    if family.of_config(mc).tied_head(mc):
        return ["framework.options.loss_parallel: the model ties its LM head to its input embedding "
                "(GPT-2 always, others with model.tie_embeddings=true): sharding the head would shard the embedding too"]
    return []


def sum_partial_grads(model) -> int:
    """Under sequence parallelism a norm's weight sees this rank's part of the sequence: its
    gradient is a partial sum (DTensor Partial). Summed over tp once, after backward, as Megatron
    does (left Partial, every optimizer op that reads it would all-reduce it again: three times for
    AdamW); FSDP2 over dp_shard has reduced them already. How many were summed."""
    from torch.distributed.tensor import DTensor, Replicate
    n = 0
    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in g.placements])
            n += 1
    return n


class TensorParallelStrategy(Strategy):
    def setup(self, build_model, build_optimizer) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from ddlbench.models.spec import count_params

        dims, ctx = self.dims, self.ctx
        shape = dims.mesh_shape()
        self.mesh = init_device_mesh(ctx.device.type, tuple(shape.values()), mesh_dim_names=tuple(shape))
        coords = dims.coords(ctx.rank)
        self.tp_rank, self.dp_rank = coords["tp"], dims.dp_rank(ctx.rank)
        model = build_on(build_model, ctx.device)
        self.params = count_params(model)
        from ddlbench.models.tensor_parallel import plan_description
        lp = self.options.loss_parallel
        self.plan = plan_description(model, lp)
        from ddlbench.models.tensor_parallel import sequence_parallel_description
        sp = self.options.sequence_parallel
        self.sp_plan = sequence_parallel_description(model) if sp else None
        try:
            self.tp_blocks = apply_tensor_parallel(model, self.mesh["tp"], sequence_parallel=sp, loss_parallel=lp)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if self.options.activation_checkpointing != "none":
            apply_checkpointing(model, self.options.activation_checkpointing)
        self.sharded = None
        if dims.dp_shard > 1:
            self.sharded = apply_fully_shard(model, self.mesh["dp_shard"], ctx.precision)
            if self.sharded.mp_policy is not None:   # FSDP2 casts: no autocast on top
                self.precision = FrameworkCast(ctx.device, ctx.precision,
                                               self.sharded.precision_summary(" over dp_shard"),
                                               master_weights="fp32 sharded parameters (cast when gathered)")
        self.model = model
        self.optimizer = build_optimizer(model.parameters())

    def _no_sync(self):
        return fsdp2_no_sync(self.model) if self.dims.dp_shard > 1 else contextlib.nullcontext()

    def train_step(self, batch: dict) -> StepOut:
        # loss parallel: forward and backward of the loss on the vocabulary shards (torch's context)
        with loss_parallel() if self.options.loss_parallel else contextlib.nullcontext():
            loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self._no_sync)
        if self.options.sequence_parallel:
            sum_partial_grads(self.model)
        self.precision.step(self.optimizer)
        return StepOut(loss=loss)

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Every tp rank computes the same sums; only tp rank 0 contributes to the evaluator's sum."""
        sums = super().eval_step(batch)
        return sums if self.tp_rank == 0 else torch.zeros_like(sums)

    def describe(self) -> dict:
        native = {
            "api": "torch.distributed.tensor.parallel.parallelize_module (DTensor)"
                   + (" + torch.distributed.fsdp.fully_shard over dp_shard" if self.dims.dp_shard > 1 else ""),
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names)},
            "plan": self.plan, "tp_blocks": self.tp_blocks,
            "sequence_parallel": None if self.sp_plan is None else {
                **self.sp_plan, "norm weight gradients": "summed over tp once after backward (Megatron's SP)"},
            "loss_parallel": self.options.loss_parallel,
            "order": "tensor parallel -> activation checkpointing -> FSDP2",
            "activation_checkpointing": describe_ac(self.options.activation_checkpointing),
            "mp_policy": None if self.sharded is None else self.sharded.mp_record(),
            "backend": self.ctx.backend,
        }
        return {"version": torch.__version__, "native_config": native}
