"""A model whose blocks are all alike (its family's `uniform_blocks`) has the forward of its memory
profile measured on 3 blocks and 2, and scaled to its depth (ddlbench/estimate/profile.py): the
profile must be the one measured on every block, field for field, for each family that says so, in
fp32 and bf16 (autocast figures too), on CPU and as built for CUDA (SDPA)."""
from __future__ import annotations

import dataclasses

import pytest

from ddlbench.estimate import profile as prof_mod
from ddlbench.models.family import of_config
from ddlbench.planning.config import plan_from_overrides

# Mixtral is not among them: its checkpointed figure does not grow by one block's share per block
# (the router logits of every layer meet in the auxiliary loss), so it is measured whole
# DeepSeek-V3 after its dense first layers (deepseek_v3_tiny: one): measured on 1 + 3 blocks and 1 + 2
UNIFORM = ["gpt2_tiny", "llama_tiny", "qwen3_tiny", "deepseek_v3_tiny"]


def _measured_on_every_block(monkeypatch, mc, precision, device):
    """The profile as it was before scaling: every block measured (the family said not uniform)."""
    with monkeypatch.context() as m:
        m.setattr(prof_mod, "SHALLOW", 10 ** 6)      # deeper than any model: never scaled
        return prof_mod._profile(mc, precision, device)


@pytest.mark.parametrize("precision,device", [("fp32", "cpu"), ("bf16", "cuda")])
@pytest.mark.parametrize("preset", UNIFORM)
def test_a_uniform_model_scaled_from_three_blocks_is_the_model_measured_whole(monkeypatch, preset, precision, device):
    mc = plan_from_overrides([f"model={preset}", "model.n_layer=7"]).cfg.model
    assert of_config(mc).uniform_blocks(mc)
    scaled = prof_mod._profile(mc, precision, device)
    whole = _measured_on_every_block(monkeypatch, mc, precision, device)
    assert scaled.blocks == 7 and len(scaled.pieces) == 7 + 2
    # which blocks hold experts, counted per piece (not spread evenly): DeepSeek-V3's first layer is dense
    assert scaled.sparse_blocks() == ([False] + [True] * 6 if preset == "deepseek_v3_tiny" else [False] * 7)
    for f in dataclasses.fields(whole):
        assert getattr(scaled, f.name) == getattr(whole, f.name), f.name
