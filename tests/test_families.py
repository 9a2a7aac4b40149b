"""The model-family contract (docs/adding-a-model.md): every family in ddlbench/models/families/
follows the checklist, checked item by item on its tiny preset (built on CPU, nothing trained)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from ddlbench import models
from ddlbench.models import family as families
from ddlbench.planning.config import plan_from_overrides

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "conf" / "model").glob("*.yaml"))}


def family_of(preset: dict) -> str:
    return "torchvision" if preset.get("kind") == "vision" else preset.get("family", "gpt2")


def tiny(name: str) -> str:
    """The family's smallest test preset (item 9)."""
    found = sorted(p for p, raw in PRESETS.items() if family_of(raw) == name and p.endswith("_tiny"))
    assert found, f"item 9: no conf/model/*_tiny.yaml of family {name}"
    return found[0]


def test_the_guide_names_every_item_and_the_families_are_the_folder():
    guide = (ROOT / "docs" / "adding-a-model.md").read_text()
    for n in range(1, 11):
        assert f"\n{n}. **" in guide, f"docs/adding-a-model.md lacks item {n}"
    assert set(families.names()) >= {"gpt2", "llama", "qwen3", "qwen3_moe", "mixtral", "torchvision"}
    assert {family_of(raw) for raw in PRESETS.values()} <= set(families.names())


@pytest.mark.parametrize("name", families.names())
def test_every_family_follows_the_checklist(name):
    # 1: the file exports FAMILY named after it, no transformers import at its top
    fam = families.get(name)
    assert fam.name == name and fam.kind in ("language", "vision")
    source = (ROOT / "ddlbench" / "models" / "families" / f"{name}.py").read_text()
    top = source.split("\ndef ", 1)[0]
    assert "import transformers" not in top and "from transformers" not in top, "item 1: transformers at import"
    # 2: the spec builds, random init, on CPU; the family is recorded with it
    preset = tiny(name)
    cfg = plan_from_overrides([f"model={preset}"]).cfg.model
    spec = models.build(cfg)
    assert spec.family is fam
    torch.manual_seed(0)
    model = spec.build().eval()
    # 3: blocks, all of one class
    blocks = model.blocks()
    assert blocks and len({type(b) for b in blocks}) == 1, "item 3"
    # 4: pieces compute the model's own logits
    from ddlbench.models.pipeline import pieces
    gen = torch.Generator().manual_seed(1)
    samples = [spec.sample(gen) for _ in range(2)]
    batch = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
    with torch.no_grad():
        x = batch["input_ids" if "input_ids" in batch else "images"]
        want = model.net(input_ids=x, use_cache=False).logits if fam.kind == "language" else model.net(x)
        for piece in pieces(model):
            x = piece(x)
    assert torch.equal(x, want), "item 4"
    # 5: keys: those the family does not name are refused
    assert set(fam.required_keys) | set(fam.optional_keys) <= set(families.FAMILY_KEYS), "item 5"
    unused = [k for k in families.FAMILY_KEYS if k not in set(fam.required_keys) | set(fam.optional_keys)]
    if fam.kind == "language" and "n_kv_head" in unused:
        assert families.key_errors(fam, {"n_kv_head": 2}), "item 5: an unused key must be refused"
    for key in fam.required_keys:
        assert families.key_errors(fam, {k: 1 for k in fam.required_keys if k != key}), f"item 5: {key} required"
    # 6: the tensor-parallel plan names the blocks' class and layers they have
    plan = fam.tensor_parallel
    if plan is not None and fam.kind == "language":
        assert type(blocks[0]).__name__ == plan.block_class, "item 6"
        for layer in plan.split_layers:
            blocks[0].get_submodule(layer)
        assert fam.tp_widths(cfg), "item 6: tp_widths"
    # 7: experts in transformers' layout
    if fam.experts is not None:
        from ddlbench.models.moe import experts_of, moe_layers
        layers = moe_layers(model)
        assert layers and cfg.moe is not None, "item 7"
        for layer, experts in zip(layers, experts_of(model)):
            assert experts.gate_up_proj.dim() == 3 and experts.down_proj.dim() == 3
            assert experts.num_experts == cfg.moe.num_experts == getattr(layer, fam.experts.router_attr).num_experts
    # 8: the analytic count equals torch's
    if fam.analytic_flops is not None:
        from ddlbench.models.flops import train_flops_per_sample
        f = train_flops_per_sample(spec)
        assert f["flops"] == f["analytic"]["train_per_sample"], "item 8"
        assert fam.linear_layers, "item 8: a family counted analytically is a Llama-like one"
    # 10: README's model table names it
    assert f"`{name}`" in (ROOT / "README.md").read_text(), f"item 10: README lacks `{name}`"


def test_a_key_of_another_family_is_refused_naming_it():
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="head_dim: not a key of family gpt2"):
        plan_from_overrides(["model=gpt2_tiny", "+model.head_dim=32"])
    with pytest.raises(ConfigError, match="family qwen3 needs model.head_dim"):
        plan_from_overrides(["model=qwen3_tiny", "model.head_dim=null"])
