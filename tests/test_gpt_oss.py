"""The GPT-OSS family (ddlbench/models/families/gpt_oss.py): attention sinks, every second layer within a
sliding window, biased routers and experts with a clamped SwiGLU. Its published shapes counted on meta,
its FLOPs by hand, its bad input refused; it trains under expert parallelism as on one rank (a pipeline's
stages rebuild each layer's own mask: tests/test_equivalence.py holds that against DDP)."""
from __future__ import annotations

import pytest

from ddlbench import models
from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides


def _cfg(name: str, *more: str):
    return plan_from_overrides([f"model={name}", *more]).cfg.model


def test_tiny_flops_by_hand():
    """gpt_oss_tiny per token, forward, 2 FLOPs a multiply-add: attention projections 2 x 128 x (2 x 128 +
    2 x 64) = 98,304 (q and o: 4 heads of 32; k and v: 2 of 32); scores and AV over T = 128: 4 x 128 x 128 =
    65,536 (a sliding layer's eager attention computes the whole T x T too, and masks); router 2 x 128 x 8 =
    2,048; two experts' SwiGLU 2 x 2 x 3 x 128 x 32 = 49,152. Two layers: 430,080; training x 3: 1,290,240;
    the head 3 x 2 x 128 x 256 = 196,608: 1,486,848 a token, x 128 = 190,316,544 a sample; torch's flop
    counter (meta, the experts' uniform forward) the same."""
    from ddlbench.models.flops import train_flops_per_sample
    f = train_flops_per_sample(models.build(_cfg("gpt_oss_tiny")))
    assert f["analytic"]["train_per_sample"] == 190_316_544 and f["flops"] == 190_316_544


@pytest.mark.parametrize("name,total,active", [("gpt_oss_20b", 20.91e9, 3.61e9), ("gpt_oss_120b", 116.83e9, 5.13e9)])
def test_published_shapes_count_their_parameters(name, total, active):
    """OpenAI's model card: 21B with 3.6B active, 117B with 5.1B active; its active count leaves out the
    input embedding (201,088 x 2,880), which ours keeps."""
    import torch

    from ddlbench.models.moe import param_counts
    spec = models.build(_cfg(name))
    with torch.device("meta"):
        counts = param_counts(spec.build(), 4)
    assert counts["total"] == pytest.approx(total, rel=1e-3)
    assert counts["active"] - 201_088 * 2_880 == pytest.approx(active, rel=5e-3)


@pytest.mark.parametrize("overrides,message", [
    (["model.moe.norm_topk_prob=false"], "softmax over its top-k"),
    (["model.attention=sdpa"], "eager attention"),
    (["~model.sliding_window"], "needs model.sliding_window"),
])
def test_bad_input_is_refused_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _cfg("gpt_oss_tiny", *overrides)


@pytest.mark.slow
def test_expert_parallel_matches_one_rank(tmp_path):
    """ep=2 over 2 ranks (each rank 4 of the 8 experts of each layer, their biases with them) gives the
    one-rank losses (without the load-balancing loss: a per-rank mean) and the same parameters."""
    from test_moe import ep_matches_one_rank
    common = ("model=gpt_oss_tiny", "model.moe.aux_loss_coef=0", "run.global_batch=8", "run.warmup_steps=1",
              "run.measure_steps=3")
    _, ep = ep_matches_one_rank(tmp_path, *common)
    assert ep["moe"]["experts_per_rank"] == 4 and len(ep["moe"]["tokens_per_expert"]) == 2
