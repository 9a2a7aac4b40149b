"""Llama 3.x (transformers' LlamaForCausalLM from a LlamaConfig, random init): RMSNorm, SwiGLU MLP,
rotary embeddings, grouped-query attention; rope scaling is left out (it changes the rotary
frequencies past the original context, not the cost)."""
from __future__ import annotations

from ddlbench.models import decoder
from ddlbench.models.family import Family, TensorParallelPlan


def config(mc, device_type: str = "cpu"):
    from transformers import LlamaConfig
    kw = decoder.config_kwargs(mc, device_type)
    kw["rms_norm_eps"] = mc.rms_norm_eps or 1e-5
    return LlamaConfig(**kw)


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "LlamaForCausalLM", device_type)


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **decoder.dense_mlp_flops(mc)}, vocab)


SPLIT = {**decoder.ATTENTION_SPLIT, **decoder.MLP_SPLIT}

FAMILY = Family(
    name="llama", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.llama.modeling_llama"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "intermediate_size", "rope_theta"),
    optional_keys=("rms_norm_eps", "tie_embeddings", "head_dim"),
    check=decoder.gqa_errors,
    tensor_parallel=TensorParallelPlan("LlamaDecoderLayer", decoder.tp_plan(SPLIT), SPLIT,
                                       {**decoder.ATTENTION_DESCRIPTION, **decoder.MLP_DESCRIPTION},
                                       decoder.tp_plan(SPLIT, sequence_parallel=True), decoder.sp_model),
    tp_widths=decoder.tp_widths, linear_layers=True, analytic_flops=analytic_flops, sequence_split=True,
    uniform_blocks=lambda mc: True,
)
