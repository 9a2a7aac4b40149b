"""ModelSpec: what the runner and adapters need to know about a model, nothing framework-specific."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str                                   # language | vision
    factory: Callable[[], nn.Module]            # builds a LossModel on the current default device
    sample: Callable[[torch.Generator], dict]   # one synthetic sample, seeded
    tokens_per_sample: Optional[int]            # None for vision
    config: dict                                # the model's native config (GPT2Config, arch...)
    # the same model with an attention whose FLOPs count on the meta device (eager: the matmuls
    # SDPA and flash kernels run, which need a real tensor to pick a mask); None = `factory`
    count_factory: Optional[Callable[[], nn.Module]] = None
    family: Optional[object] = None             # its ddlbench.models.family.Family
    # the family's analytic training FLOPs per token ({"total", "parts", "convention"}), where it has one
    analytic_flops: Optional[dict] = None
    top_k: Optional[int] = None                 # MoE: experts per token (active parameters)

    def build(self) -> nn.Module:
        return self.factory()


def count_params(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def example_batch(spec: ModelSpec, n: int, device: str, mask: bool = True) -> dict:
    """n seeded synthetic samples as a batch on `device` (meta: shapes only, for counting); a
    language batch carries an all-ones attention mask unless `mask` is false (a model under
    sdpa_causal refuses one: see models.language.takes_mask)."""
    gen = torch.Generator().manual_seed(0)
    samples = [spec.sample(gen) for _ in range(n)]
    batch = {k: torch.stack([s[k] for s in samples]).to(device) for k in samples[0]}
    if spec.kind == "language" and mask:
        # an explicit all-ones mask skips HF's packed-sequence check, which calls .item()
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch
