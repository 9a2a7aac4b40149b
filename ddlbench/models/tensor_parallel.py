"""Megatron-style tensor parallelism with DTensor's `parallelize_module` on a 1-D "tp" DeviceMesh: each
model family declares its block plan (`Family.tensor_parallel`, ddlbench/models/families/); the
conversions and the plan's bookkeeping live here.

Per block: attention QKV column-wise (each rank computes its own heads), attention output
row-wise (one all-reduce in forward), MLP fc column-wise, MLP projection row-wise (one
all-reduce). Embeddings, layer norms and the LM/classifier head stay replicated (the GPT-2
lm_head/wte tie is untouched) unless loss parallelism shards the head. Sequence parallelism
(Megatron's, an option of the tensor-parallel variants, for the Llama-like dense families:
ddlbench/models/decoder.py's tp_plan and sp_model) runs the norms on parts of the sequence and
replaces each all-reduce by an all-gather before and a reduce-scatter after; without it the norms
run replicated. Loss parallelism (torchtitan's, the `loss_parallel` option) shards the LM head over the
vocabulary and computes the cross-entropy on the shards (apply_loss_parallel).

Two conversions make the plans apply, both exact (same outputs, same parameter count and
order, same values up to a permutation within a tensor):
- HF GPT-2 uses `Conv1D` (y = x W + b, W of shape in x out), which ColwiseParallel /
  RowwiseParallel do not accept; each is replaced by an `nn.Linear` holding W transposed.
- The fused QKV projection (GPT-2 c_attn, ViT's nn.MultiheadAttention in_proj) is laid out
  [q | k | v]; a plain column split would give rank 0 all of q and half of k. Its output rows
  are permuted to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] so that rank r's contiguous shard holds
  the q, k, v of its heads, and the attention module is told its local width (GPT-2:
  split_size; ViT: the replacement attention below works on local heads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def qkv_permutation(width: int, tp: int) -> torch.Tensor:
    """Row order that turns [q | k | v] (each `width` rows) into per-rank [q_r k_r v_r] blocks."""
    if width % tp:
        raise ValueError(f"width {width} is not divisible by tp {tp}")
    local = width // tp
    order = [part * width + r * local + i for r in range(tp) for part in range(3) for i in range(local)]
    return torch.tensor(order)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor | None = None,
            transposed: bool = False) -> nn.Linear:
    """nn.Linear with the given (out, in) weight, rows optionally permuted. It carries
    `canonical_layout` = (rows, transposed), how to put its parameters back in the layout of the
    module it replaced (ddlbench.adapters.common.canonical_parameters: fingerprints compare with DDP's)."""
    out_f, in_f = weight.shape
    lin = nn.Linear(in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight if rows is None else weight[rows])
        if bias is not None:
            lin.bias.copy_(bias if rows is None else bias[rows])
    lin.canonical_layout = (None if rows is None else rows.cpu(), transposed)
    return lin


def from_conv1d(conv, rows: torch.Tensor | None = None) -> nn.Linear:
    return _linear(conv.weight.detach().t(), conv.bias.detach(), rows, transposed=True)


class LocalHeadsAttention(nn.Module):
    """Self-attention for torchvision's EncoderBlock (stands in for nn.MultiheadAttention,
    batch_first, called as attn(x, x, x, need_weights=False)) on `heads` local heads, with a
    fused in_proj laid out per rank and an out_proj; parameters in MultiheadAttention's order."""

    def __init__(self, mha: nn.MultiheadAttention, tp: int):
        super().__init__()
        width = mha.embed_dim
        self.in_proj = _linear(mha.in_proj_weight.detach(), mha.in_proj_bias.detach(), qkv_permutation(width, tp))
        self.out_proj = _linear(mha.out_proj.weight.detach(), mha.out_proj.bias.detach())
        self.heads, self.head_dim, self.dropout = mha.num_heads // tp, width // mha.num_heads, mha.dropout

    def forward(self, query, key=None, value=None, need_weights: bool = False):
        b, t, _ = query.shape
        q, k, v = self.in_proj(query).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1)), None


def plans() -> dict:
    """Every family's block plan, by the class name of the block it applies to."""
    from ddlbench.models import family
    out = {}
    for name in family.names():
        plan = family.get(name).tensor_parallel
        if plan is not None:
            out[plan.block_class] = plan
    return out


def tp_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks inside `module` (a model, a pipeline stage or piece) that a family's plan applies to."""
    known = plans()
    return [(type(m).__name__, m) for m in module.modules() if type(m).__name__ in known]


def apply_tensor_parallel(module: nn.Module, mesh, sequence_parallel: bool = False, loss_parallel: bool = False,
                          shard_embedding: bool = False) -> int:
    """Convert and parallelize every planned block inside `module`; returns how many. With
    `sequence_parallel` (a whole model: its family's SP plan, and the model around the blocks; a pipeline
    stage: decoder.sp_stage, the embedding row-wise with `shard_embedding`); with `loss_parallel` (a causal
    LM or the stage holding its head: apply_loss_parallel)."""
    blocks = tp_blocks(module)
    if not blocks:
        raise ValueError("tensor parallelism has no plan for this model's blocks (a family without "
                         "Family.tensor_parallel)")
    known = plans()
    for kind, block in blocks:
        plan = known[kind]
        if sequence_parallel and plan.sequence_parallel is None:
            raise ValueError(f"sequence parallelism has no plan for {kind}")
        (plan.sequence_parallel if sequence_parallel else plan.apply)(block, mesh)
    if sequence_parallel and hasattr(module, "net"):
        known[blocks[0][0]].sp_model(module.net, [b for _, b in blocks], mesh, loss_parallel)
    elif sequence_parallel:      # a pipeline stage: its pieces
        from ddlbench.models.decoder import sp_stage
        sp_stage(module, mesh, loss_parallel, shard_embedding)
    if loss_parallel:
        apply_loss_parallel(module, mesh, sequence_parallel)
    return len(blocks)


def lm_head(module: nn.Module):
    """A causal LM's head (`net.lm_head`) or a pipeline stage's (its DecoderHead piece's); None where it has none."""
    if hasattr(module, "net"):
        return getattr(module.net, "lm_head", None)
    return next((m.lm_head for m in module.children() if type(m).__name__ == "DecoderHead"), None)


LOSS_PARALLEL = {"lm_head": "ColwiseParallel(output_layouts=Shard(-1), use_local_output=False): each tp rank computes "
                            "the logits of its part of the vocabulary",
                 "loss": "cross-entropy on the vocabulary shards under torch.distributed.tensor.parallel.loss_parallel "
                         "(all-reduces of each position's max, sum of exponentials and target logit)"}


def loss_parallel_errors(model: nn.Module, tp: int) -> list[str]:
    """Why a built model cannot shard its head over the vocabulary (torchtitan's loss parallel)."""
    head = getattr(getattr(model, "net", None), "lm_head", None)
    if not isinstance(head, nn.Linear):
        return ["framework.options.loss_parallel needs a causal language model with an lm_head"]
    embed = model.net.get_input_embeddings()
    if embed is not None and embed.weight is head.weight:
        return ["framework.options.loss_parallel: the model ties its lm_head to its input embedding "
                "(model.tie_embeddings): sharding the head would shard the embedding too"]
    if head.out_features % tp:
        return [f"framework.options.loss_parallel: the vocabulary ({head.out_features}, padded) is not divisible by tp = {tp}"]
    return []


def apply_loss_parallel(model: nn.Module, mesh, sequence_parallel: bool = False) -> None:
    """torchtitan's loss parallel: the LM head column-wise over the vocabulary, its logits left as a
    DTensor sharded on the vocabulary (the loss then runs under `loss_parallel()`: the strategy's
    step). Its input: the replicated hidden states, or with sequence parallelism their parts,
    all-gathered by the head's own input layout."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    if hasattr(model, "net"):       # a whole model (a pipeline stage: only the one with the head has one to shard)
        errors = loss_parallel_errors(model, mesh.size())
        if errors:
            raise ValueError("; ".join(errors))
    head = lm_head(model)
    if head is not None:
        parallelize_module(head, mesh, ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                                       output_layouts=Shard(-1), use_local_output=False))


def sequence_parallel_description(module: nn.Module) -> dict | None:
    """What the family's sequence-parallel plan does, for the record; None where it has none."""
    from ddlbench.models.decoder import SP_DESCRIPTION
    blocks = tp_blocks(module)
    return SP_DESCRIPTION if blocks and plans()[blocks[0][0]].sequence_parallel is not None else None


def split_param_count(module: nn.Module) -> int:
    """Parameters of `module` (as built) that the plan shards over the tp ranks; the rest
    (embeddings, norms, row-wise biases, the head) every tp rank keeps whole."""
    n, known = 0, plans()
    for kind, block in tp_blocks(module):
        for name, bias_split in known[kind].split_layers.items():
            parent, _, leaf = name.rpartition(".")
            owner = block.get_submodule(parent)
            if leaf == "in_proj" and isinstance(owner, nn.MultiheadAttention):
                weight, bias = owner.in_proj_weight, owner.in_proj_bias
            else:
                layer = owner.get_submodule(leaf)
                weight, bias = layer.weight, layer.bias
            n += weight.numel() + (bias.numel() if bias_split and bias is not None else 0)
    return n


def plan_description(model: nn.Module, loss_parallel: bool = False) -> dict:
    """The record's description of the plan a model's blocks got."""
    known = plans()
    kinds = sorted({kind for kind, _ in tp_blocks(model)})
    if loss_parallel:
        return {**{kind: known[kind].description for kind in kinds}, **LOSS_PARALLEL, "replicated": "embeddings, norms"}
    return {**{kind: known[kind].description for kind in kinds},
            "replicated": "embeddings, norms, LM/classifier head (no vocabulary parallelism: see the loss_parallel option)"}
