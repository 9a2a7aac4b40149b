"""A model's profile for the memory estimator, measured on the meta device (no memory, no
compute, so XL presets cost nothing): parameters, the largest block, and the bytes autograd saves
for backward per sample — counted by torch.autograd.graph.saved_tensors_hooks, with and without
activation checkpointing, over two batch sizes so that the per-sample slope excludes what does
not grow with the batch."""
from __future__ import annotations

import torch

from bench.advise.memory import ModelProfile


def _saved_bytes(spec, batch_size: int, checkpointed: bool) -> tuple[int, int]:
    """(bytes saved for backward by one forward, bytes of one block's output) on meta."""
    from models.spec import checkpoint_blocks, example_batch

    with torch.device("meta"):
        model = spec.build()
    if checkpointed:
        checkpoint_blocks(model)
    params = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params:      # parameters are not activations
            saved[id(base)] = base.numel() * base.element_size()
        return t

    boundary = []
    blocks = model.blocks()
    hook = blocks[0].register_forward_hook(
        lambda m, i, o: boundary.append((o[0] if isinstance(o, tuple) else o).numel() * 4)) if blocks else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**example_batch(spec, batch_size, "meta"))
    if hook is not None:
        hook.remove()
    return sum(saved.values()), (boundary[0] if boundary else 0)


def profile(model_cfg) -> ModelProfile:
    from models.spec import build, count_params

    spec = build(model_cfg, "cpu")
    with torch.device("meta"):
        model = spec.build()
    blocks = model.blocks()
    full2, out2 = _saved_bytes(spec, 2, False)
    full4, _ = _saved_bytes(spec, 4, False)
    ck2, _ = _saved_bytes(spec, 2, True) if blocks else (full2, 0)
    ck4, _ = _saved_bytes(spec, 4, True) if blocks else (full4, 0)
    return ModelProfile(
        params=count_params(model),
        largest_block_params=max((count_params(b) for b in blocks), default=count_params(model)),
        blocks=max(len(blocks), 1),
        activation_bytes_per_sample=(full4 - full2) // 2,
        checkpointed_bytes_per_sample=(ck4 - ck2) // 2,
        boundary_bytes_per_sample=out2 // 2)
