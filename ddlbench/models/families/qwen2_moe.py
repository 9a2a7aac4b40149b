"""Qwen2-MoE / Qwen1.5-MoE (transformers' Qwen2MoeForCausalLM from a Qwen2MoeConfig, random init):
DeepSeekMoE's idea of fine-grained routed experts beside a shared expert: every layer a softmax
top-k router over moe.num_experts small SwiGLU experts (moe.intermediate_size) plus one shared
SwiGLU expert (moe.shared_intermediate_size) every token goes through, scaled by a sigmoid gate;
attention with q/k/v biases (Qwen2); dropless; the load-balancing loss times moe.aux_loss_coef."""
from __future__ import annotations

from ddlbench.models import decoder, moe
from ddlbench.models.family import ExpertsPlan, Family, TensorParallelPlan


def config(mc, device_type: str = "cpu"):
    from transformers import Qwen2MoeConfig
    return Qwen2MoeConfig(**moe.qwen_moe_kwargs(mc, device_type),
                          shared_expert_intermediate_size=mc.moe.shared_intermediate_size)


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "Qwen2MoeForCausalLM", device_type,
                          count_config=moe.count_config)


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **moe.layer_flops(mc)}, vocab)


def check(mc) -> list[str]:
    errors = decoder.gqa_errors(mc) + moe.not_deepseek_routing("qwen2_moe")(mc)
    if mc.moe is not None and not mc.moe.shared_intermediate_size:
        errors.append("family qwen2_moe needs model.moe.shared_intermediate_size (its shared expert's width)")
    return errors


FAMILY = Family(
    name="qwen2_moe", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.qwen2_moe.modeling_qwen2_moe"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "rope_theta", "moe"),
    optional_keys=("rms_norm_eps", "tie_embeddings", "head_dim"),
    check=check,
    # the dense part: attention (q/k/v biases sharded with their columns); router, experts and the
    # shared expert replicated over tp (the experts go to expert parallelism)
    tensor_parallel=TensorParallelPlan("Qwen2MoeDecoderLayer", decoder.tp_plan(decoder.ATTENTION_SPLIT),
                                       decoder.ATTENTION_SPLIT,
                                       {**decoder.ATTENTION_DESCRIPTION,
                                        "mlp (router, experts, shared expert)": "replicated over tp"}),
    tp_widths=lambda mc: decoder.tp_widths(mc, dense_mlp=False),
    experts=ExpertsPlan(moe.mlp_with_experts),
    linear_layers=True, analytic_flops=analytic_flops,
)
