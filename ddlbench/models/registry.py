"""The model factory, in one place: a model config -> its family (ddlbench/models/family.py) -> its
ModelSpec. ddlbench/models/spec.py defines what a spec is and imports no family."""
from __future__ import annotations

from ddlbench.models.family import of_config
from ddlbench.models.spec import ModelSpec


def modules_for(model_cfg) -> tuple[str, ...]:
    """The libraries `build(model_cfg).build()` imports (a launcher preloads them)."""
    return of_config(model_cfg).modules(model_cfg)


def build(model_cfg, device_type: str = "cpu") -> ModelSpec:
    """The model's spec for a run on `device_type` (device-dependent defaults: the attention kernel)."""
    return of_config(model_cfg).spec(model_cfg, device_type)
