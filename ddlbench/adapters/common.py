"""What several adapters share, beside the contract (ddlbench/adapters/base.py): autocast for the
run's precision, a step over micro-batches, framework no-sync contexts, the canonical view of
parameters that the equivalence tests compare, labels of the taxonomy, the process's peak RSS."""
from __future__ import annotations

import contextlib
import resource

import torch
from torch import nn


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def autocast(ctx):
    """Autocast for the run's precision (ctx: the rank's RankContext); fp32 runs have none."""
    if ctx.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if ctx.precision == "bf16" else torch.float16
    return torch.autocast(device_type=ctx.device.type, dtype=dtype)


def split_micro(batch: dict, n: int) -> list[dict]:
    """Split a local batch into n equal micro-batches (gradient accumulation)."""
    if n == 1:
        return [batch]
    parts = {k: v.chunk(n) for k, v in batch.items()}
    return [{k: parts[k][i] for k in batch} for i in range(n)]


def forward_backward(model, batch: dict, grad_accum: int, ctx, no_sync,
                     scaler=None) -> torch.Tensor:
    """Forward+backward over `grad_accum` micro-batches; gradients are synchronised only on the
    last one (`no_sync()` is the framework's context for the others). Returns the mean loss."""
    micro = split_micro(batch, grad_accum)
    total = torch.zeros((), device=ctx.device)
    for i, mb in enumerate(micro):
        sync = contextlib.nullcontext() if i == len(micro) - 1 else no_sync()
        with sync:
            with autocast(ctx):
                loss = model(**mb)
            scaled = loss / len(micro)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total += loss.detach().float()
    return total / len(micro)


def batch_norms(model: nn.Module) -> list[nn.Module]:
    """The model's batch-norm layers with parameters: cuDNN's batch norm needs their parameters
    in the dtype of their running statistics, which mixed-precision wrappers keep fp32."""
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight is not None]


@contextlib.contextmanager
def fsdp2_no_sync(model: nn.Module):
    """FSDP2's no_sync: no gradient reduce-scatter for the micro-batches inside the block."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def canonical_parameters(module: nn.Module):
    """(parameter, full tensor -> canonical layout) in `module.parameters()` order, each once.
    A module that replaced another with a different layout (ddlbench/models/tensor_parallel: Conv1D ->
    Linear transposes W; the fused QKV rows are permuted per rank) carries `canonical_layout`
    = (rows, transposed); everything else is already canonical."""
    seen = set()
    for m in module.modules():
        layout = getattr(m, "canonical_layout", None)
        for name, p in m.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            yield p, (lambda t, layout=layout, name=name: _to_canonical(t, layout, name))


def _to_canonical(t: torch.Tensor, layout, name: str) -> torch.Tensor:
    if layout is None:
        return t
    rows, transposed = layout
    if rows is not None:
        t = t[torch.argsort(rows).to(t.device)]
    return t.t() if transposed and name == "weight" else t


def param_row(t: torch.Tensor) -> list[float]:
    """[sum, sum of squares, sum of |x|, position-weighted sum] of a full parameter in float64.
    The last is sum_i x_i (i+1)/n over the row-major elements: it changes when values move
    (a permuted QKV layout, transposed shards), which the first three cannot see."""
    t = t.detach().double().reshape(-1)
    pos = torch.arange(1, t.numel() + 1, dtype=torch.float64, device=t.device) / max(t.numel(), 1)
    return [float(t.sum()), float((t * t).sum()), float(t.abs().sum()), float((t * pos).sum())]


def unwrap(model: nn.Module) -> nn.Module:
    """The LossModel inside framework wrappers (DDP/DeepSpeed `.module`)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def taxonomy_labels(parallelism: str, sync: str, pattern: str, sharding: str = "none",
                    compression: str = "none") -> dict:
    return {"parallelism": parallelism, "synchronisation": sync, "communication": pattern,
            "sharding": sharding, "compression": compression}
