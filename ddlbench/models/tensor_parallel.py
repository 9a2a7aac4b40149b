"""Megatron-style tensor-parallel plans for GPT-2 and Llama (Hugging Face) and ViT (torchvision) blocks,
with DTensor's `parallelize_module` on a 1-D "tp" DeviceMesh.

Per block: attention QKV column-wise (each rank computes its own heads), attention output
row-wise (one all-reduce in forward), MLP fc column-wise, MLP projection row-wise (one
all-reduce). Embeddings, layer norms and the LM/classifier head stay replicated (the GPT-2
lm_head/wte tie is untouched; vocabulary parallelism is not implemented). Sequence parallelism
is not implemented: norms and dropout run replicated.

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


def _from_conv1d(conv, rows: torch.Tensor | None = None) -> nn.Linear:
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


def _gpt2_block(block: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    attn, mlp = block.attn, block.mlp
    width = attn.embed_dim
    attn.c_attn = _from_conv1d(attn.c_attn, qkv_permutation(width, tp))
    attn.c_proj = _from_conv1d(attn.c_proj)
    mlp.c_fc = _from_conv1d(mlp.c_fc)
    mlp.c_proj = _from_conv1d(mlp.c_proj)
    attn.split_size = attn.embed_dim = width // tp
    attn.num_heads //= tp
    parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                     "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()})


def _llama_block(block: nn.Module, mesh) -> None:
    """Llama's projections are separate Linears (no fused QKV): q, k, v column-wise (rank r keeps
    query heads r*H/tp.. and key/value heads r*KV/tp..: the same GQA groups), o row-wise; SwiGLU's
    gate and up column-wise, down row-wise. LlamaAttention reshapes with -1 heads, so it runs on
    its local heads as it is (torchtitan's plan for Llama)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(block, mesh, {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                                     "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                                     "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                                     "mlp.down_proj": RowwiseParallel()})


def _vit_block(block: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    block.self_attention = LocalHeadsAttention(block.self_attention, mesh.size())
    parallelize_module(block, mesh, {"self_attention.in_proj": ColwiseParallel(),
                                     "self_attention.out_proj": RowwiseParallel(),
                                     "mlp.0": ColwiseParallel(), "mlp.3": RowwiseParallel()})


def tp_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks a plan applies to: HF GPT2Block and LlamaDecoderLayer, torchvision EncoderBlock."""
    return [(type(m).__name__, m) for m in module.modules() if type(m).__name__ in BLOCK_PLANS]


def apply_tensor_parallel(module: nn.Module, mesh) -> int:
    """Convert and parallelize every GPT-2 / Llama / ViT block inside `module`; returns how many."""
    blocks = tp_blocks(module)
    if not blocks:
        raise ValueError("tensor parallelism has a plan for GPT-2, Llama and ViT blocks only")
    for kind, block in blocks:
        BLOCK_PLANS[kind](block, mesh)
    return len(blocks)


BLOCK_PLANS = {"GPT2Block": _gpt2_block, "LlamaDecoderLayer": _llama_block, "EncoderBlock": _vit_block}


# per block kind: the layers the plan shards, and whether their bias is sharded too (column-wise)
# or replicated (row-wise); names in the model as built (before the Conv1D / attention conversions)
SPLIT_LAYERS = {"GPT2Block": {"attn.c_attn": True, "attn.c_proj": False, "mlp.c_fc": True, "mlp.c_proj": False},
                "LlamaDecoderLayer": {"self_attn.q_proj": True, "self_attn.k_proj": True, "self_attn.v_proj": True,
                                      "self_attn.o_proj": False, "mlp.gate_proj": True, "mlp.up_proj": True,
                                      "mlp.down_proj": False},
                "EncoderBlock": {"self_attention.in_proj": True, "self_attention.out_proj": False,
                                 "mlp.0": True, "mlp.3": False}}


def split_param_count(module: nn.Module) -> int:
    """Parameters of `module` (as built) that the plan shards over the tp ranks; the rest
    (embeddings, norms, row-wise biases, the head) every tp rank keeps whole."""
    n = 0
    for kind, block in tp_blocks(module):
        for name, bias_split in SPLIT_LAYERS[kind].items():
            parent, _, leaf = name.rpartition(".")
            owner = block.get_submodule(parent)
            if leaf == "in_proj" and isinstance(owner, nn.MultiheadAttention):
                weight, bias = owner.in_proj_weight, owner.in_proj_bias
            else:
                layer = owner.get_submodule(leaf)
                weight, bias = layer.weight, layer.bias
            n += weight.numel() + (bias.numel() if bias_split and bias is not None else 0)
    return n


PLAN_DESCRIPTION = {
    "GPT2Block": {"attn.c_attn": "ColwiseParallel (Conv1D->Linear, rows permuted per rank's heads)",
                  "attn.c_proj": "RowwiseParallel (Conv1D->Linear)",
                  "mlp.c_fc": "ColwiseParallel (Conv1D->Linear)", "mlp.c_proj": "RowwiseParallel (Conv1D->Linear)"},
    "LlamaDecoderLayer": {"self_attn.q_proj/k_proj/v_proj": "ColwiseParallel (local query and key/value heads)",
                          "self_attn.o_proj": "RowwiseParallel",
                          "mlp.gate_proj/up_proj": "ColwiseParallel", "mlp.down_proj": "RowwiseParallel"},
    "EncoderBlock": {"self_attention.in_proj": "ColwiseParallel (MultiheadAttention -> LocalHeadsAttention, rows permuted)",
                     "self_attention.out_proj": "RowwiseParallel", "mlp.0": "ColwiseParallel",
                     "mlp.3": "RowwiseParallel"},
    "replicated": "embeddings, layer norms, LM/classifier head (no vocabulary or sequence parallelism)",
}
