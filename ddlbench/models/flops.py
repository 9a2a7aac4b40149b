"""Training FLOPs per sample, counted with torch.utils.flop_counter (forward + backward).

Counted on the meta device (no memory, no compute), so it is cheap for XL presets and never runs
the model on the host. Attention is counted whatever kernel the run uses: where SDPA or flash
attention picks its mask from tensor values (which meta tensors do not have), the count runs on
the same model with eager attention, the same matmuls (ModelSpec.count_factory); torch's SDPA
formula and the eager matmuls both count the full T x T scores (the non-causal convention, as
PaLM's 12*L*H*Q*T does). Model FLOPs (MFU) count one forward and one
backward; hardware FLOPs (HFU) count what runs, i.e. with activation checkpointing the block
forwards a second time, counted the same way on a model with the same checkpointing applied. For transformers the PaLM formula
(Chowdhery et al. 2022, appendix B: 6N + 12*L*H*Q*T per token) is reported beside it.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.models.moe import param_counts as moe_param_counts
from ddlbench.models.spec import ModelSpec, count_params, example_batch


def _count(spec: ModelSpec, device: str, recompute_blocks: bool | str = False) -> int:
    from ddlbench.models import checkpointing
    with torch.device(device):
        model = (spec.count_factory or spec.factory)()
    # the run's activation checkpointing (a policy, or true = full): backward re-runs what it dropped
    checkpointing.apply(model, checkpointing.normalize(recompute_blocks))
    # vision: two samples, as BatchNorm in training mode needs more than one value per channel;
    n = 2
    batch = example_batch(spec, n, device)
    counter = FlopCounterMode(display=False)
    with counter:
        model(**batch).backward()
    return int(counter.get_total_flops()) // n


def train_flops_per_sample(spec: ModelSpec, recompute_blocks: bool | str = False) -> dict:
    """{'flops': model FLOPs, 'hardware_flops': FLOPs executed (with the recomputed forward of
    checkpointed blocks), 'method': str, 'palm_flops': int | None, 'analytic': the family's analytic
    count per sample | None, 'params': {'total', 'active'} | None}. For a Mixture-of-Experts model
    every count is of active FLOPs (each token through its top-k experts) and PaLM's 6N uses the
    active parameters."""
    flops = _count(spec, "meta")
    method = "flop_counter(meta)" + (", eager attention (the same matmuls)" if spec.count_factory else "")
    if spec.top_k:
        method += ", experts on uniform routing (each token through its top-k experts: the active FLOPs)"
    hardware = _count(spec, "meta", recompute_blocks) if recompute_blocks not in (False, "none") else flops
    palm = params = analytic = None
    if spec.kind == "language":
        c = spec.config     # the transformers config's names (a value equal to its default is left out)
        n_layer = c.get("n_layer", c.get("num_hidden_layers", 12))
        n_embd, n_head = c.get("n_embd", c.get("hidden_size", 768)), c.get("n_head", c.get("num_attention_heads", 12))
        head_dim = c.get("head_dim") or n_embd // n_head
        with torch.device("meta"):
            model = spec.build()
        params = {"total": count_params(model)}
        params["active"] = (moe_param_counts(model, spec.top_k)["active"] if spec.top_k else params["total"])
        palm = palm_train_flops_per_token(params["active"], n_layer, n_head, head_dim,
                                          spec.tokens_per_sample) * spec.tokens_per_sample
        if spec.analytic_flops:
            a = spec.analytic_flops
            # a causal kernel computes about half of the T x T scores (and their products with V)
            causal = a["total"] - a["parts"].get("attention scores", 0) / 2
            analytic = {"train_per_sample": a["total"] * spec.tokens_per_sample,
                        "causal_train_per_sample": causal * spec.tokens_per_sample,
                        "parts_per_token": a["parts"], "convention": a["convention"],
                        "counted_over_analytic": flops / (a["total"] * spec.tokens_per_sample)}
    return {"flops": flops, "hardware_flops": hardware, "method": method, "palm_flops": palm,
            "analytic": analytic, "params": params}


def palm_train_flops_per_token(params: int, n_layer: int, n_head: int, head_dim: int, seq: int) -> int:
    """PaLM appendix B: 6N + 12*L*H*Q*T training FLOPs per token."""
    return 6 * params + 12 * n_layer * n_head * head_dim * seq
