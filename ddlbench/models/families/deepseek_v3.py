"""DeepSeek-V3 (transformers' DeepseekV3ForCausalLM from a DeepseekV3Config, random init): multi-head
latent attention (MLA: keys and values from a compressed latent, queries from another, a shared
rotary key part; model.mla), the first moe.first_k_dense layers a dense SwiGLU MLP of
intermediate_size, the rest a Mixture-of-Experts MLP: sigmoid scores over moe.num_experts routed
SwiGLU experts of moe.intermediate_size, each token's top moe.top_k chosen within the moe.topk_group
best of moe.n_group expert groups, their weights renormalised (moe.norm_topk_prob) and scaled by
moe.routed_scaling_factor, beside shared experts (moe.shared_intermediate_size: a multiple of the
routed width, DeepSeek's n_shared_experts) every token goes through; dropless.

Not here: the auxiliary-loss-free balancing's bias updates (transformers keeps the router's
e_score_correction_bias at zero in training: moe.aux_loss_coef must be 0, DeepSeek-V3 has no such
loss), multi-token prediction (DeepSeek-V3's MTP module), and a tensor-parallel plan for MLA (TP is
refused; FSDP2, ZeRO, pipelines and expert parallelism run it)."""
from __future__ import annotations

from ddlbench.models import decoder, moe
from ddlbench.models.family import ExpertsPlan, Family


def config(mc, device_type: str = "cpu"):
    from transformers import DeepseekV3Config
    m, a = mc.moe, mc.mla
    kw = decoder.config_kwargs(mc, device_type)
    kw["num_key_value_heads"] = mc.n_head           # MLA: every head its own key and value
    kw.pop("intermediate_size", None)
    return DeepseekV3Config(
        **kw, intermediate_size=mc.intermediate_size or m.intermediate_size,
        moe_intermediate_size=m.intermediate_size, n_routed_experts=m.num_experts, num_experts_per_tok=m.top_k,
        n_shared_experts=(m.shared_intermediate_size or 0) // m.intermediate_size,
        routed_scaling_factor=m.routed_scaling_factor, n_group=m.n_group or 1, topk_group=m.topk_group or 1,
        first_k_dense_replace=m.first_k_dense, norm_topk_prob=m.norm_topk_prob,
        q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_nope_head_dim,
        qk_rope_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim,
        experts_implementation=moe.experts_implementation(m.experts_implementation, device_type))


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "DeepseekV3ForCausalLM", device_type,
                          count_config=moe.count_config)


def attention_flops(mc) -> dict:
    """One MLA layer's forward FLOPs per token (2 per multiply-add): the query (through its latent
    where q_lora_rank is set), the latent and rotary key, the latent's keys and values for every head,
    the output; the scores over the full T x T (qk_nope + qk_rope per head) and their product with the
    values (v_head_dim per head)."""
    a, h, n, t = mc.mla, mc.n_embd, mc.n_head, mc.seq_len
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    q = h * a.q_lora_rank + a.q_lora_rank * n * qk if a.q_lora_rank else h * n * qk
    kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
    return {"attention projections": 2 * (q + kv + n * a.v_head_dim * h), "attention scores": 2 * t * n * (qk + a.v_head_dim)}


def analytic_flops(mc, vocab: int) -> dict:
    """Training FLOPs per token (3 x forward): attention in every layer, a dense SwiGLU in the first
    first_k_dense, the router, top_k routed experts and the shared experts in the rest."""
    m = mc.moe
    dense, sparse = m.first_k_dense, mc.n_layer - m.first_k_dense
    parts = {k: 3 * mc.n_layer * v for k, v in attention_flops(mc).items()}
    parts["dense mlp"] = 3 * dense * 2 * 3 * mc.n_embd * (mc.intermediate_size or m.intermediate_size)
    parts["router"] = 3 * sparse * 2 * mc.n_embd * m.num_experts
    parts["routed experts"] = 3 * sparse * m.top_k * 2 * 3 * mc.n_embd * m.intermediate_size
    parts["shared experts"] = 3 * sparse * 2 * 3 * mc.n_embd * (m.shared_intermediate_size or 0)
    parts["lm head"] = 3 * 2 * mc.n_embd * vocab
    return {"total": sum(parts.values()), "parts": parts,
            "convention": "2 FLOPs per multiply-add; forward + backward = 3 x forward; attention scores over "
                          "the full T x T (non-causal); embeddings, norms, softmax and elementwise ops not counted"}


def check(mc) -> list[str]:
    m, errors = mc.moe, []
    if m is None or mc.mla is None:
        return errors
    if m.aux_loss_coef:
        errors.append("model.moe.aux_loss_coef: DeepSeek-V3 balances its experts without an auxiliary loss "
                      "(its router's bias; transformers has no such loss for it): set 0")
    if m.shared_intermediate_size and m.shared_intermediate_size % m.intermediate_size:
        errors.append(f"model.moe.shared_intermediate_size {m.shared_intermediate_size} is not a multiple of "
                      f"model.moe.intermediate_size {m.intermediate_size} (DeepSeek's shared experts are routed-width experts)")
    groups = m.n_group or 1
    if m.num_experts % groups or (m.topk_group or 1) > groups:
        errors.append(f"model.moe: {m.num_experts} experts in n_group {groups} groups, topk_group {m.topk_group} of them: "
                      "the groups must divide the experts and topk_group be at most n_group")
    elif m.num_experts // groups < 2:
        errors.append("model.moe: each expert group needs at least 2 experts (a group's score is its best two)")
    if m.first_k_dense >= mc.n_layer:
        errors.append(f"model.moe.first_k_dense {m.first_k_dense} leaves no MoE layer of {mc.n_layer}")
    if m.first_k_dense and not mc.intermediate_size:
        errors.append("model.moe.first_k_dense needs model.intermediate_size (the dense layers' SwiGLU width)")
    return errors


FAMILY = Family(
    name="deepseek_v3", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.deepseek_v3.modeling_deepseek_v3"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("rope_theta", "moe", "mla"),
    optional_keys=("rms_norm_eps", "tie_embeddings", "intermediate_size"),
    check=check, experts=ExpertsPlan(moe.mlp_with_experts), linear_layers=True, analytic_flops=analytic_flops,
    uniform_blocks=lambda mc: mc.moe is not None, leading_blocks=lambda mc: mc.moe.first_k_dense,
)
