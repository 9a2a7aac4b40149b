"""Qwen3-MoE (transformers' Qwen3MoeForCausalLM from a Qwen3MoeConfig, random init): Qwen3's
attention (per-head q/k norms, explicit head_dim) and, in every layer, a Mixture-of-Experts MLP:
a softmax top-k router (top-k weights renormalised with moe.norm_topk_prob) over moe.num_experts
SwiGLU experts of width moe.intermediate_size; dropless; Switch Transformer's load-balancing
loss times moe.aux_loss_coef (router_aux_loss_coef)."""
from __future__ import annotations

from ddlbench.models import decoder, moe
from ddlbench.models.family import ExpertsPlan, Family, TensorParallelPlan


def config(mc, device_type: str = "cpu"):
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(**moe.qwen_moe_kwargs(mc, device_type))


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "Qwen3MoeForCausalLM", device_type,
                          count_config=moe.count_config)


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **moe.layer_flops(mc)}, vocab)


FAMILY = Family(
    name="qwen3_moe", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.qwen3_moe.modeling_qwen3_moe"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "rope_theta", "head_dim", "moe"),
    optional_keys=("rms_norm_eps", "tie_embeddings"),
    check=lambda mc: decoder.gqa_errors(mc) + moe.no_shared_expert("qwen3_moe")(mc),
    # the dense part only: attention; the router stays whole, the experts go to expert parallelism
    tensor_parallel=TensorParallelPlan("Qwen3MoeDecoderLayer", decoder.tp_plan(decoder.ATTENTION_SPLIT),
                                       decoder.ATTENTION_SPLIT,
                                       {**decoder.ATTENTION_DESCRIPTION,
                                        "self_attn.q_norm/k_norm": "replicated, gradient summed over tp (HeadNorm)",
                                        "mlp (router, experts)": "replicated over tp (experts: expert parallelism)"}),
    tp_widths=lambda mc: decoder.tp_widths(mc, dense_mlp=False),
    experts=ExpertsPlan(moe.mlp_with_experts), linear_layers=True, analytic_flops=analytic_flops,
    # every layer sparse and alike; with the load-balancing loss (its router logits of every layer gathered at
    # the end) the memory profile measures the whole model
    uniform_blocks=lambda mc: mc.moe is not None and mc.moe.aux_loss_coef == 0,
)
