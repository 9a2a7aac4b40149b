"""GPT-OSS (transformers' GptOssForCausalLM from a GptOssConfig, random init): grouped-query
attention with q/k/v/o biases and a learned sink logit per head, every second layer attending within a
window of model.sliding_window tokens (the others the whole causal sequence), YaRN rotary embeddings
(the model's own defaults), and in every layer a Mixture-of-Experts MLP: a linear router with a bias,
softmax over each token's top moe.top_k logits, experts of width moe.intermediate_size with biases and
GPT-OSS's clamped SwiGLU (gate and up interleaved in one [E, H, 2I] weight); dropless; the
load-balancing loss times moe.aux_loss_coef.

Not here: MXFP4 weights (how the released checkpoints are stored, not how they train), a
tensor-parallel plan (the sinks would be sharded with the heads; TP is refused) and SDPA or flash attention (transformers runs the sinks in eager or flex attention only:
attention is eager wherever the preset says auto). A pipeline stage builds each layer's own mask
(ddlbench/models/decoder.py DecoderBlock: the sliding window where the layer has one)."""
from __future__ import annotations

import types

import torch

from ddlbench.models import decoder, moe
from ddlbench.models.family import ExpertsPlan, Family


def config(mc, device_type: str = "cpu"):
    from transformers import GptOssConfig
    m = mc.moe
    kw = decoder.config_kwargs(mc, device_type)
    kw.pop("rope_theta", None)            # YaRN with the model's own parameters
    kw.pop("hidden_act", None)
    return GptOssConfig(**kw, intermediate_size=m.intermediate_size, num_local_experts=m.num_experts,
                        num_experts_per_tok=m.top_k, sliding_window=mc.sliding_window,
                        router_aux_loss_coef=m.aux_loss_coef)


def uniform_forward(self, hidden: torch.Tensor, router_indices: torch.Tensor, routing_weights: torch.Tensor):
    """GptOssExperts' forward for the meta device (the FLOP count, the memory profile), where its loop over
    the experts a batch hit (nonzero) cannot run: the N x k (token, expert) rows split evenly over the
    experts, each chunk through its expert's biased, clamped SwiGLU (moe.uniform_experts_forward's idea)."""
    n, k = router_indices.shape
    rows, experts = hidden.repeat_interleave(k, dim=0), self.num_experts
    if (n * k) % experts == 0:      # equal chunks: one batched matmul a projection (the same FLOPs, E x fewer ops)
        gated = self._apply_gate(torch.bmm(rows.view(experts, n * k // experts, -1), self.gate_up_proj)
                                 + self.gate_up_proj_bias[:, None])
        out = (torch.bmm(gated, self.down_proj) + self.down_proj_bias[:, None]).reshape(n * k, -1)
    else:
        sizes = [len(range(e, n * k, experts)) for e in range(experts)]
        out = torch.cat([self._apply_gate(chunk @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]) @ self.down_proj[e]
                         + self.down_proj_bias[e] for e, chunk in enumerate(rows.split(sizes))])
    out = out * routing_weights.reshape(-1, 1).to(hidden.dtype)
    return out.view(n, k, -1).sum(1)


def count_model(model) -> None:
    for experts in moe.experts_of(model):
        experts.forward = types.MethodType(uniform_forward, experts)


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.language import causal_lm_spec
    return causal_lm_spec(mc, FAMILY, config(mc, device_type), "GptOssForCausalLM", device_type,
                          count_model=count_model, attention="eager")


def analytic_flops(mc, vocab: int) -> dict:
    return decoder.training_flops(mc, {**decoder.attention_flops(mc), **moe.layer_flops(mc)}, vocab)


def check(mc) -> list[str]:
    errors = decoder.gqa_errors(mc) + moe.no_shared_expert("gpt_oss")(mc)
    if mc.moe is not None and not mc.moe.norm_topk_prob:
        errors.append("model.moe.norm_topk_prob: GPT-OSS always takes the softmax over its top-k logits (keep true)")
    if getattr(mc, "attention", "auto") in ("sdpa", "sdpa_causal"):
        errors.append("model.attention: GPT-OSS's attention sinks run in eager attention here (no SDPA path)")
    return errors


FAMILY = Family(
    name="gpt_oss", kind="language", spec=spec,
    modules=lambda mc: ("ddlbench.models.language", "transformers.models.gpt_oss.modeling_gpt_oss"),
    blocks=decoder.blocks, pieces=decoder.pieces,
    required_keys=("n_kv_head", "head_dim", "moe", "sliding_window"),
    optional_keys=("rms_norm_eps", "tie_embeddings"),
    check=check, experts=ExpertsPlan(moe.mlp_with_experts, router_attr="router"), linear_layers=True,
    analytic_flops=analytic_flops,
    # sliding and full layers differ in their mask only: eager attention computes the same T x T either way
    uniform_blocks=lambda mc: True,
)
