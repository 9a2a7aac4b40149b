"""Qwen3 dense (transformers' Qwen3ForCausalLM from a Qwen3Config, random init): Llama's layout with
per-head RMSNorm on queries and keys (q_norm, k_norm on head_dim) and an explicit head_dim."""
from __future__ import annotations

from ddlbench.models import decoder
from ddlbench.models.family import Family, TensorParallelPlan


def config(mc, device_type: str = "cpu"):
    from transformers import Qwen3Config
    return Qwen3Config(**decoder.config_kwargs(mc, device_type))


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "Qwen3ForCausalLM", device_type)


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **decoder.dense_mlp_flops(mc)}, vocab)


SPLIT = {**decoder.ATTENTION_SPLIT, **decoder.MLP_SPLIT}

FAMILY = Family(
    name="qwen3", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.qwen3.modeling_qwen3"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "intermediate_size", "rope_theta", "head_dim"),
    optional_keys=("rms_norm_eps", "tie_embeddings"),
    check=decoder.gqa_errors,
    tensor_parallel=TensorParallelPlan("Qwen3DecoderLayer", decoder.tp_plan(SPLIT), SPLIT,
                                       {**decoder.ATTENTION_DESCRIPTION, **decoder.MLP_DESCRIPTION,
                                        "self_attn.q_norm/k_norm": "replicated, gradient summed over tp (HeadNorm: each rank sees its own heads)"},
                                       decoder.tp_plan(SPLIT, sequence_parallel=True), decoder.sp_model),
    tp_widths=decoder.tp_widths, linear_layers=True, analytic_flops=analytic_flops, sequence_split=True,
    uniform_blocks=lambda mc: True,
)
