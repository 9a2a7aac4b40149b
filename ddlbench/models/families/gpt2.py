"""GPT-2 (transformers' GPT2LMHeadModel from a GPT2Config, random init): learned positions,
LayerNorm, GELU MLP of width 4 x n_embd, fused QKV in Conv1D layers, lm_head tied to wte."""
from __future__ import annotations

import torch
from torch import nn

from ddlbench.models.family import Family, TensorParallelPlan
from ddlbench.models.masks import causal_mask


def gpt2_activation(requested: str, device_type: str) -> str:
    """auto: gelu_pytorch_tanh on CUDA (one fused kernel; autocast runs gelu_new's pow in fp32),
    GPT-2's own gelu_new on CPU (the numbers the CPU suite and reports were measured with)."""
    if requested != "auto":
        return requested
    return "gelu_pytorch_tanh" if device_type == "cuda" else "gelu_new"


def config(mc, device_type: str = "cpu"):
    from transformers import GPT2Config

    from ddlbench.models.vocab import padded_vocab
    return GPT2Config(
        n_layer=mc.n_layer, n_embd=mc.n_embd, n_head=mc.n_head,
        vocab_size=padded_vocab(mc.vocab_size, getattr(mc, "pad_vocab_to", "auto"), device_type),
        activation_function=gpt2_activation(getattr(mc, "activation", "auto"), device_type),
        n_positions=mc.seq_len, resid_pdrop=mc.dropout, embd_pdrop=mc.dropout,
        attn_pdrop=mc.dropout, bos_token_id=mc.vocab_size - 1, eos_token_id=mc.vocab_size - 1,
        loss_type="ForCausalLM",
    )


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "GPT2LMHeadModel", device_type)


class _Embed(nn.Module):
    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class _Block(nn.Module):
    """One GPT-2 block with the causal mask GPT2Model builds for it (no padding, no cache)."""

    def __init__(self, block: nn.Module, config):
        super().__init__()
        self.block, self.config = block, config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = causal_mask(self.config, hidden)
        return self.block(hidden, None, mask, position_ids=pos)


class _LMHead(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.ln_f, self.lm_head = net.transformer.ln_f, net.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def pieces(net: nn.Module) -> list[nn.Module]:
    """Embed (wte + wpe + dropout) | one piece per transformer block | Head (ln_f + lm_head)."""
    return [_Embed(net.transformer), *(_Block(b, net.config) for b in net.transformer.h), _LMHead(net)]


def tp_block(block: nn.Module, mesh) -> None:
    """Conv1D layers become nn.Linear (ColwiseParallel/RowwiseParallel take Linear); the fused QKV's
    rows are permuted so that each rank's contiguous shard holds the q, k, v of its heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ddlbench.models.tensor_parallel import from_conv1d, qkv_permutation
    tp = mesh.size()
    attn, mlp = block.attn, block.mlp
    width = attn.embed_dim
    attn.c_attn = from_conv1d(attn.c_attn, qkv_permutation(width, tp))
    attn.c_proj = from_conv1d(attn.c_proj)
    mlp.c_fc = from_conv1d(mlp.c_fc)
    mlp.c_proj = from_conv1d(mlp.c_proj)
    attn.split_size = attn.embed_dim = width // tp
    attn.num_heads //= tp
    parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                     "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()})


FAMILY = Family(
    name="gpt2", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.gpt2.modeling_gpt2"),
    blocks=lambda net: list(net.transformer.h), pieces=pieces,
    optional_keys=("activation",),
    tensor_parallel=TensorParallelPlan(
        "GPT2Block", tp_block,
        {"attn.c_attn": True, "attn.c_proj": False, "mlp.c_fc": True, "mlp.c_proj": False},
        {"attn.c_attn": "ColwiseParallel (Conv1D->Linear, rows permuted per rank's heads)",
         "attn.c_proj": "RowwiseParallel (Conv1D->Linear)",
         "mlp.c_fc": "ColwiseParallel (Conv1D->Linear)", "mlp.c_proj": "RowwiseParallel (Conv1D->Linear)"}),
    tp_widths=lambda mc: {"model.n_head": mc.n_head, "model.n_embd": mc.n_embd, "4*model.n_embd (MLP)": 4 * mc.n_embd},
    uniform_blocks=lambda mc: True,
    tied_head=lambda mc: True,
)
