"""What several strategies share, beside the contract (ddlbench/adapters/base.py): a step over
micro-batches, framework no-sync contexts, the canonical view of parameters that the equivalence
tests compare, the memory peaks the runner reads around setup and the loop."""
from __future__ import annotations

import contextlib
import resource

import torch
from torch import nn


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def setup_peaks(device: torch.device) -> dict:
    """Called by the runner right after setup: on CUDA, keep setup's peak (the full model placed
    before sharding or offload) and reset the peak counters, so the reported peaks are the
    training loop's (ZeRO-3/FSDP/offload savings stay visible). Host RSS has no reset
    (ru_maxrss): its value here is kept as the setup peak."""
    peaks = {"setup_peak_rss_bytes": peak_rss_bytes(), "setup_peak_allocated_bytes": None}
    if device.type == "cuda":
        peaks["setup_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    return peaks


def loop_peaks(device: torch.device, setup: dict) -> dict:
    """Peaks of the training loop: device allocated/reserved (CUDA, reset after setup), host RSS
    (since process start), and setup's own peaks."""
    out = {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "peak_rss_bytes": peak_rss_bytes(), **setup}
    if device.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out


def split_micro(batch: dict, n: int) -> list[dict]:
    """Split a local batch into n equal micro-batches (gradient accumulation)."""
    if n == 1:
        return [batch]
    parts = {k: v.chunk(n) for k, v in batch.items()}
    return [{k: parts[k][i] for k in batch} for i in range(n)]


def build_on(build_model, device: torch.device) -> nn.Module:
    """The model created on the rank's device: parameters allocated and initialised there, not on
    the host and then copied (on a GPU the init kernels run there: Llama 1B took 14-23 s to build
    on the host of an H200 machine). On CPU the same as build_model()."""
    with torch.device(device):
        return build_model()


def forward_backward(model, batch: dict, grad_accum: int, precision, no_sync) -> torch.Tensor:
    """Forward+backward over `grad_accum` micro-batches under the run's precision
    (ddlbench/adapters/precision.py); gradients are synchronised only on the last one (`no_sync()`
    is the framework's context for the others). Returns the mean loss."""
    micro = split_micro(batch, grad_accum)
    total = torch.zeros((), device=precision.device)
    for i, mb in enumerate(micro):
        sync = contextlib.nullcontext() if i == len(micro) - 1 else no_sync()
        with sync:
            with precision.forward_context():
                loss = model(**precision.inputs(mb))
            precision.backward(loss / len(micro))
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


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (tensor parallel), or the tensor itself."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole of a DTensor, gathered (collective), or the tensor itself."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def send_any(h: torch.Tensor, dst: int) -> None:
    """Blocking send of an fp32 tensor of any shape (up to 8 dimensions): its shape first, then it."""
    import torch.distributed as dist
    shape = torch.full((8,), -1, dtype=torch.int64)
    shape[: h.dim()] = torch.tensor(h.shape)
    dist.send(shape.to(h.device), dst)
    dist.send(h.contiguous(), dst)


def recv_any(src: int, device: torch.device) -> torch.Tensor:
    """The fp32 tensor send_any sent from `src`."""
    import torch.distributed as dist
    shape = torch.empty(8, dtype=torch.int64, device=device)
    dist.recv(shape, src)
    h = torch.empty([int(d) for d in shape if d >= 0], device=device)
    dist.recv(h, src)
    return h


def unwrap(model: nn.Module) -> nn.Module:
    """The LossModel inside framework wrappers (DDP/DeepSpeed `.module`)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model

