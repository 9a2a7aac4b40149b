"""Mixtral (transformers' MixtralForCausalLM from a MixtralConfig, random init): Llama/Mistral
attention and, in every layer, moe.num_experts SwiGLU experts of width moe.intermediate_size behind a
softmax top-k router whose top-k weights are renormalised (Mixtral's routing; moe.norm_topk_prob
must stay true); dropless; the load-balancing loss times moe.aux_loss_coef."""
from __future__ import annotations

from ddlbench.models import decoder, moe
from ddlbench.models.family import ExpertsPlan, Family, TensorParallelPlan


def config(mc, device_type: str = "cpu"):
    from transformers import MixtralConfig
    m = mc.moe
    kw = decoder.config_kwargs(mc, device_type)
    kw["intermediate_size"] = m.intermediate_size    # Mixtral's name for the experts' width
    return MixtralConfig(**kw, num_local_experts=m.num_experts, num_experts_per_tok=m.top_k,
                         router_aux_loss_coef=m.aux_loss_coef, sliding_window=None,
                         experts_implementation=moe.experts_implementation(m.experts_implementation, device_type))


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "MixtralForCausalLM", device_type,
                          count_config=moe.count_config)


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **moe.layer_flops(mc)}, vocab)


def check(mc) -> list[str]:
    errors = decoder.gqa_errors(mc) + moe.no_shared_expert("mixtral")(mc)
    if mc.moe is not None and not mc.moe.norm_topk_prob:
        errors.append("model.moe.norm_topk_prob: Mixtral always renormalises its top-k weights (keep true)")
    return errors


FAMILY = Family(
    name="mixtral", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.mixtral.modeling_mixtral"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "rope_theta", "moe"),
    optional_keys=("rms_norm_eps", "tie_embeddings", "head_dim"),
    check=check,
    tensor_parallel=TensorParallelPlan("MixtralDecoderLayer", decoder.tp_plan(decoder.ATTENTION_SPLIT),
                                       decoder.ATTENTION_SPLIT,
                                       {**decoder.ATTENTION_DESCRIPTION,
                                        "mlp (router, experts)": "replicated over tp (experts: expert parallelism)"}),
    tp_widths=lambda mc: decoder.tp_widths(mc, dense_mlp=False),
    experts=ExpertsPlan(lambda block: block.mlp), linear_layers=True, analytic_flops=analytic_flops,
)
