"""The run's optimizer, built the same way for every framework, and the objective it minimises.

`optim.exclude_from_decay=bias_and_norm` puts parameters with fewer than two dimensions (biases,
LayerNorm/BatchNorm scales and shifts) in a parameter group with weight_decay 0, the usual
exclusion; the rule reads only a parameter's (global) shape, so sharded parameters (FSDP2
DTensors, pipeline stages) fall in the same group as in DDP.
"""
from __future__ import annotations

from typing import Iterable

import torch


def decays(ndim: int, exclude_from_decay: str) -> bool:
    """Whether a parameter with `ndim` dimensions gets the run's weight decay."""
    return exclude_from_decay == "none" or ndim >= 2


def param_groups(params: Iterable, weight_decay: float, exclude_from_decay: str) -> list[dict]:
    """torch.optim parameter groups: [decayed] or [decayed, not decayed] (empty groups dropped)."""
    params = list(params)
    if not params:
        raise ValueError("the optimizer got no parameters")
    groups = [{"params": [p for p in params if decays(p.ndim, exclude_from_decay)], "weight_decay": weight_decay},
              {"params": [p for p in params if not decays(p.ndim, exclude_from_decay)], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


IMPL_KWARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}


def optimizer_impl(requested: str, device_type: str) -> str:
    """optim.impl: auto = fused on CUDA (torch's fused AdamW/SGD: one kernel for every parameter,
    what torchtitan uses), the for-loop on CPU (torch's default there; the suite's numbers)."""
    if requested != "auto":
        return requested
    return "fused" if device_type == "cuda" else "for_loop"


def build_optimizer_factory(optim_cfg, device_type: str = "cpu"):
    """params -> the run's torch optimizer (AdamW or SGD) with the decay groups above, in the
    implementation optimizer_impl decides (`build.impl`)."""
    impl = optimizer_impl(getattr(optim_cfg, "impl", "auto"), device_type)

    def build(params):
        params = list(params)
        # a wrapper that partitions groups itself (FairScale OSS) hands back groups we made
        groups = params if params and isinstance(params[0], dict) else \
            param_groups(params, optim_cfg.weight_decay, optim_cfg.exclude_from_decay)
        if optim_cfg.name == "adamw":
            return torch.optim.AdamW(groups, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                                     eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay, **IMPL_KWARGS[impl])
        return torch.optim.SGD(groups, lr=optim_cfg.lr, momentum=optim_cfg.momentum,
                               weight_decay=optim_cfg.weight_decay, **IMPL_KWARGS[impl])
    build.optim_cfg = optim_cfg  # adapters that must build the optimizer natively read this
    build.impl = impl
    return build


def regularised_objective(mean_loss: float, param_stats: list, weight_decay: float,
                          exclude_from_decay: str) -> dict:
    """The objective that SGD with `weight_decay` minimises: mean loss + wd/2 x sum of squares of
    the decayed parameters. `param_stats`: (ndim, [sum, sum of squares, ...]) per parameter.
    (AdamW's decoupled decay minimises no such objective; the value is still reported.)"""
    sq = sum(row[1] for ndim, row in param_stats if decays(ndim, exclude_from_decay))
    return {"value": mean_loss + 0.5 * weight_decay * sq, "mean_loss": mean_loss,
            "decayed_sum_of_squares": sq, "weight_decay": weight_decay,
            "exclude_from_decay": exclude_from_decay,
            "definition": "mean training loss over the whole training split (eval mode) + "
                          "weight_decay/2 x sum of squares of the decayed parameters"}
