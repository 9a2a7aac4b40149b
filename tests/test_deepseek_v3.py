"""The DeepSeek-V3 family (ddlbench/models/families/deepseek_v3.py): multi-head latent attention, dense
first layers, grouped sigmoid routing over fine-grained experts beside a shared one. Its published shape
counted on meta, its FLOPs by hand, its bad input refused; it trains under expert parallelism as on one
rank and through a pipeline (tests/test_equivalence.py holds it in the DDP gate)."""
from __future__ import annotations

import pytest

from ddlbench import models
from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides


def _cfg(name: str, *more: str):
    return plan_from_overrides([f"model={name}", *more]).cfg.model


def test_tiny_flops_by_hand():
    """deepseek_v3_tiny per token, forward, 2 FLOPs a multiply-add. MLA (H 128, 4 heads, q latent 64,
    kv latent 32, 32 + 16 per head for the scores, 32 for the values): q 128 x 64 + 64 x 4 x 48 = 20,480;
    kv 128 x (32 + 16) + 32 x 4 x (32 + 32) = 14,336; o 4 x 32 x 128 = 16,384: 2 x 51,200 = 102,400;
    scores 2 x 128 x 4 x (48 + 32) = 81,920. Dense layer SwiGLU 2 x 3 x 128 x 256 = 196,608; an MoE
    layer: router 2 x 128 x 8 = 2,048, two routed experts 2 x 2 x 3 x 128 x 32 = 49,152, the shared
    one 24,576. Three layers (one dense): 3 x 184,320 + 196,608 + 2 x 75,776 = 901,120 a token
    forward; training x 3 = 2,703,360; the head 3 x 2 x 128 x 256 = 196,608: 2,899,968 a token,
    x 128 tokens = 371,195,904 a sample. torch's flop counter (meta, uniform routing) agrees."""
    from ddlbench.models.flops import train_flops_per_sample
    f = train_flops_per_sample(models.build(_cfg("deepseek_v3_tiny")))
    assert f["analytic"]["train_per_sample"] == 371_195_904
    parts = f["analytic"]["parts_per_token"]
    assert parts["attention projections"] == 3 * 3 * 102_400 and parts["attention scores"] == 3 * 3 * 81_920
    assert parts["dense mlp"] == 3 * 196_608 and parts["shared experts"] == 3 * 2 * 24_576
    assert f["flops"] == 371_195_904


def test_published_shape_counts_its_parameters():
    """DeepSeek-V3 on meta: 671B parameters, 37B active (the model card: 671B total, 37B activated per
    token; its multi-token prediction module's 14B not included), held at its own layer counts."""
    import torch

    from ddlbench.models.moe import param_counts
    spec = models.build(_cfg("deepseek_v3"))
    with torch.device("meta"):
        counts = param_counts(spec.build(), 8)
    assert counts["total"] == pytest.approx(671.0e9, rel=0.005)
    assert counts["active"] == pytest.approx(37.5e9, rel=0.02)


@pytest.mark.parametrize("overrides,message", [
    (["model.moe.aux_loss_coef=0.001"], "without an auxiliary loss"),
    (["model.moe.shared_intermediate_size=48"], "not a multiple of"),
    (["model.moe.n_group=3"], "groups must divide the experts"),
    (["model.moe.first_k_dense=3"], "leaves no MoE layer"),
    (["~model.mla"], "needs model.mla"),
])
def test_bad_input_is_refused_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _cfg("deepseek_v3_tiny", *overrides)


def test_other_families_refuse_its_routing_keys_and_tp_has_no_plan_for_mla():
    with pytest.raises(ConfigError, match="not keys of family qwen3_moe"):
        _cfg("moe_tiny", "+model.moe.n_group=2")
    with pytest.raises(ConfigError, match="tensor-parallel plan"):
        plan_from_overrides(["model=deepseek_v3_tiny", "framework=tensor_parallel", "launcher.nproc=2"])


@pytest.mark.slow
def test_expert_parallel_matches_one_rank_and_counts_its_routing(tmp_path):
    """ep=2 over 2 ranks (each rank 4 of the 8 routed experts of each MoE layer; the dense first layer
    and the shared experts replicated) gives the one-rank losses; the record counts the tokens of both
    MoE layers (the dense one has none), each token's top-2."""
    from test_moe import ep_matches_one_rank
    common = ("model=deepseek_v3_tiny", "run.global_batch=8", "run.warmup_steps=1", "run.measure_steps=3")
    _, ep = ep_matches_one_rank(tmp_path, *common)
    routed = ep["moe"]["tokens_per_expert"]     # every step's 8 samples x 128 tokens, each to 2 experts
    assert len(routed) == 2 and sum(routed[0]) == sum(routed[1]) and sum(routed[0]) % (8 * 128 * 2) == 0, routed
    assert ep["moe"]["experts_per_rank"] == 4 and ep["moe"]["ep"] == 2
