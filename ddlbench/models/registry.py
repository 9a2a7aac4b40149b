"""The model factory, in one place: a model config -> its ModelSpec (ddlbench/models/language.py for GPT-2 and Llama,
ddlbench/models/vision.py for torchvision models). ddlbench/models/spec.py defines what a spec is and imports
neither, so neither imports back into a module that imports it."""
from __future__ import annotations

from ddlbench.models.spec import ModelSpec


def modules_for(model_cfg) -> tuple[str, ...]:
    """The libraries `build(model_cfg).build()` imports (a launcher preloads them)."""
    if model_cfg.kind == "language":
        return ("ddlbench.models.language", f"transformers.models.{model_cfg.family}.modeling_{model_cfg.family}")
    return ("ddlbench.models.vision", "torchvision.models")


def build(model_cfg, device_type: str = "cpu") -> ModelSpec:
    """The model's spec for a run on `device_type` (device-dependent defaults: the attention kernel)."""
    if model_cfg.kind == "language":
        from ddlbench.models.language import language_spec
        return language_spec(model_cfg, device_type)
    from ddlbench.models.vision import vision_spec
    return vision_spec(model_cfg, device_type)
