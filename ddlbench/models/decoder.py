"""What the decoder-only families built like transformers' Llama share (Llama, Qwen3, Qwen3-MoE,
Mixtral: `model.embed_tokens`, `model.layers`, `model.norm`, `model.rotary_emb`, `lm_head`, separate
q/k/v/o projections): their blocks, pipeline pieces, the attention's tensor-parallel plan and the
analytic FLOP count. A family file (ddlbench/models/families/) picks from here."""
from __future__ import annotations

import torch
from torch import nn

from ddlbench.models.masks import causal_mask


class DecoderEmbed(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.embed_tokens = model.embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class DecoderBlock(nn.Module):
    """One decoder layer with the rotary embedding and causal (or sliding-window) mask the model builds for it
    (positions 0..T-1, no padding, no cache). The rotary module has no parameters (inv_freq buffer)."""

    def __init__(self, layer: nn.Module, config, rotary: nn.Module):
        super().__init__()
        self.layer, self.config, self.rotary = layer, config, rotary
        self.sequence_parts = 1     # > 1: `hidden` is one tp rank's part of the sequence (sp_stage)
        self.positions = None       # [1, T / cp]: this rank's positions under context parallelism (stage_context)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        whole = hidden
        if self.sequence_parts > 1:     # the positions, rotary embedding and mask of the whole sequence (a view)
            b, t, h = hidden.shape
            whole = hidden.new_empty(b, t * self.sequence_parts, 1).expand(b, t * self.sequence_parts, h)
        pos = self.positions if self.positions is not None else torch.arange(whole.shape[1], device=hidden.device).unsqueeze(0)
        # a layer that attends within a sliding window (its attention's sliding_window set: GPT-OSS) gets that mask
        sliding = getattr(getattr(self.layer, "self_attn", None), "sliding_window", None) is not None
        mask = causal_mask(self.config, whole, sliding=sliding)
        return self.layer(hidden, attention_mask=mask, position_ids=pos,
                          position_embeddings=self.rotary(whole, position_ids=pos))


class DecoderHead(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.norm, self.lm_head = net.model.norm, net.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def blocks(net: nn.Module) -> list[nn.Module]:
    return list(net.model.layers)


def pieces(net: nn.Module) -> list[nn.Module]:
    """Embed (embed_tokens) | one piece per decoder layer | Head (norm + lm_head)."""
    m = net.model
    return [DecoderEmbed(m), *(DecoderBlock(layer, net.config, m.rotary_emb) for layer in m.layers), DecoderHead(net)]


ATTENTION_SPLIT = {"self_attn.q_proj": True, "self_attn.k_proj": True, "self_attn.v_proj": True,
                   "self_attn.o_proj": False}
MLP_SPLIT = {"mlp.gate_proj": True, "mlp.up_proj": True, "mlp.down_proj": False}
ATTENTION_DESCRIPTION = {"self_attn.q_proj/k_proj/v_proj": "ColwiseParallel (local query and key/value heads)",
                         "self_attn.o_proj": "RowwiseParallel"}
MLP_DESCRIPTION = {"mlp.gate_proj/up_proj": "ColwiseParallel", "mlp.down_proj": "RowwiseParallel"}


class _SumOverRanks(torch.autograd.Function):
    """Identity in forward; the gradient summed over `group` in backward."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class HeadNorm(nn.Module):
    """A per-head RMSNorm (Qwen3's q_norm, k_norm: one weight over head_dim, shared by every head)
    on a tensor-parallel rank's local heads: the weight stays whole on every rank, and its gradient,
    which each rank computes over its own heads only, is summed over the tp ranks (all-reduce in
    backward). The same arithmetic as transformers' RMSNorm."""

    def __init__(self, norm: nn.Module, group):
        super().__init__()
        self.norm, self.group = norm, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, dtype = self.norm, x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + n.variance_epsilon)
        return _SumOverRanks.apply(n.weight, self.group) * h.to(dtype)


HEAD_NORMS = ("q_norm", "k_norm")

SP_DESCRIPTION = {"input_layernorm/post_attention_layernorm": "SequenceParallel (sequence parts)",
                  "self_attn, mlp": "PrepareModuleInput: all-gather the sequence",
                  "self_attn.o_proj, mlp.down_proj": "RowwiseParallel(output_layouts=Shard(1)): reduce-scatter",
                  "first block's input": "the replicated sequence cut to this rank's part (no communication)",
                  "model.norm": "SequenceParallel", "lm_head": "PrepareModuleInput: all-gather the sequence"}


def sp_model(net: nn.Module, layers: list[nn.Module], mesh, loss_parallel: bool = False) -> dict:
    """The model around sequence-parallel blocks (`layers`, the transformers decoder layers in
    order): the embeddings' output, replicated on every tp rank, is cut to this rank's part of the
    sequence at the first layer's input (a local slice); the final norm runs on the parts; the
    head's input is all-gathered. Positions, rotary embeddings and the causal mask are made from the
    whole sequence as before (the attention sees it whole). The record's description."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel, parallelize_module
    parallelize_module(layers[0], mesh, PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                           use_local_output=True))
    parallelize_module(net.model.norm, mesh, SequenceParallel())
    if not loss_parallel:       # under loss parallelism the column-wise head gathers its input itself
        parallelize_module(net.lm_head, mesh, PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                                 use_local_output=True))
    return SP_DESCRIPTION


def sp_stage(stage: nn.Module, mesh, loss_parallel: bool = False, shard_embedding: bool = False) -> dict:
    """Sequence parallelism across a pipeline stage's pieces (`pieces` below, blocks already under the SP
    block plan): what a stage sends the next is this rank's part of the sequence, 1/tp of the
    activations (torchtitan's 3-D layout). The embedding: with `shard_embedding` (an untied one) row-wise
    over the vocabulary as torchtitan's plan shards it (each rank looks up its rows, the sum
    reduce-scattered to sequence parts), else whole and its output cut to this rank's part (its gradient
    all-gathered in backward); each block builds its positions, rotary embedding and mask for the whole
    sequence; the final norm on the parts and the head's input all-gathered (under loss parallelism by the
    head's own input layout). The record's description."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    for piece in stage.children():
        if isinstance(piece, DecoderEmbed) and shard_embedding:
            parallelize_module(piece.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)))
        elif isinstance(piece, DecoderEmbed):
            parallelize_module(piece, mesh, PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                                use_local_output=True))
        elif isinstance(piece, DecoderBlock):
            piece.sequence_parts = mesh.size()
        elif isinstance(piece, DecoderHead):
            parallelize_module(piece.norm, mesh, SequenceParallel())
            if not loss_parallel:
                parallelize_module(piece.lm_head, mesh, PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True))
    return {**SP_DESCRIPTION, "first block's input": "the embedding row-wise over the vocabulary, reduce-scattered to "
            "sequence parts" if shard_embedding else "the embedding's output cut to this rank's part (no communication)",
            "between stages": "this rank's part of the sequence (1/tp of the activations)"}


def tp_plan(split: dict[str, bool], sequence_parallel: bool = False):
    """A block plan: q, k, v column-wise (rank r keeps query heads r*H/tp.. and key/value heads
    r*KV/tp..: the same GQA groups), o row-wise; a dense SwiGLU MLP's gate and up column-wise, down
    row-wise. The attention reshapes with -1 heads, so it runs on its local heads as it is
    (torchtitan's plan for Llama); per-head q/k norms (Qwen3) become HeadNorm. With
    `sequence_parallel` (Megatron's SP, torchtitan's plan): the block's input and output are this
    rank's part of the sequence; the two norms run on it (SequenceParallel), the sequence is
    all-gathered before attention and before the MLP, and the row-wise layers reduce-scatter their
    output back to sequence parts instead of all-reducing it."""
    def apply(block: nn.Module, mesh) -> None:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )
        if not sequence_parallel:
            plan = {name: ColwiseParallel() if col else RowwiseParallel() for name, col in split.items()}
        else:
            plan = {name: ColwiseParallel() if col else RowwiseParallel(output_layouts=Shard(1))
                    for name, col in split.items()}
            plan |= {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                     "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                     desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
        parallelize_module(block, mesh, plan)
        attn = block.self_attn
        for name in HEAD_NORMS:
            if hasattr(attn, name):
                setattr(attn, name, HeadNorm(getattr(attn, name), mesh.get_group()))
    return apply


def tp_widths(mc, dense_mlp: bool = True) -> dict[str, int]:
    widths = {"model.n_head": mc.n_head, "model.n_kv_head": mc.n_kv_head}
    if dense_mlp:
        widths["model.intermediate_size"] = mc.intermediate_size
    return widths


def head_dim(mc) -> int:
    return mc.head_dim or mc.n_embd // mc.n_head


def attention_flops(mc) -> dict:
    """Forward FLOPs per token of one attention layer (2 per multiply-add): the q, k, v, o
    projections, and QK^T and AV over the full sequence (the non-causal convention, as PaLM's
    12*L*H*Q*T and torch's flop counter count them)."""
    h, d, t = mc.n_embd, head_dim(mc), mc.seq_len
    q, kv = mc.n_head * d, mc.n_kv_head * d
    return {"attention projections": 2 * h * (2 * q + 2 * kv), "attention scores": 2 * 2 * t * q}


def training_flops(mc, layer_parts: dict, vocab: int) -> dict:
    """Training FLOPs per token = 3 x forward (backward: twice the forward's matmuls), the
    convention of model FLOPs (MFU), no recomputation. `layer_parts`: one layer's forward FLOPs."""
    parts = {k: 3 * mc.n_layer * v for k, v in layer_parts.items()}
    parts["lm head"] = 3 * 2 * mc.n_embd * vocab
    return {"total": sum(parts.values()), "parts": parts,
            "convention": "2 FLOPs per multiply-add; forward + backward = 3 x forward; attention scores over "
                          "the full T x T (non-causal); embeddings, norms, softmax and elementwise ops not counted"}


def config_kwargs(mc, device_type: str) -> dict:
    """The keyword arguments every Llama-like transformers config takes, from the preset."""
    from ddlbench.models.vocab import padded_vocab
    kw = dict(num_hidden_layers=mc.n_layer, hidden_size=mc.n_embd, num_attention_heads=mc.n_head,
              num_key_value_heads=mc.n_kv_head,
              vocab_size=padded_vocab(mc.vocab_size, getattr(mc, "pad_vocab_to", "auto"), device_type),
              max_position_embeddings=mc.seq_len, rope_theta=mc.rope_theta, rms_norm_eps=mc.rms_norm_eps or 1e-6,
              attention_dropout=mc.dropout, tie_word_embeddings=bool(mc.tie_embeddings), hidden_act="silu",
              bos_token_id=mc.vocab_size - 1, eos_token_id=mc.vocab_size - 1)
    if mc.intermediate_size:
        kw["intermediate_size"] = mc.intermediate_size
    if mc.head_dim:
        kw["head_dim"] = mc.head_dim
    return kw


def gqa_errors(mc) -> list[str]:
    return ([f"n_head {mc.n_head} is not divisible by n_kv_head {mc.n_kv_head}"]
            if mc.n_kv_head and mc.n_head % mc.n_kv_head else [])


def dense_mlp_flops(mc) -> dict:
    """A SwiGLU MLP (gate, up, down: 3 matmuls of n_embd x intermediate_size) per token."""
    return {"mlp": 2 * 3 * mc.n_embd * mc.intermediate_size}
