"""A model's profile for the memory estimator, measured on the meta device (no memory, no
compute, so XL presets cost nothing): parameters, the largest block, and the bytes autograd saves
for backward per sample — counted by torch.autograd.graph.saved_tensors_hooks, with and without
activation checkpointing, over two batch sizes so that the per-sample slope excludes what does
not grow with the batch — and the same per pipeline piece (ddlbench/models/pipeline.py: embedding, each
block, head with the loss), with the piece's forward FLOPs (torch.utils.flop_counter) and the
parameters the tensor-parallel plan splits: what lets tensor and pipeline parallelism keep the
embedding and head whole instead of dividing the whole model evenly."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.adapters.cost import ModelProfile, Piece


def _saver(params: set, saved: dict, seen: set = frozenset()):
    """A saved_tensors_hooks pack function recording {storage id: bytes} of what autograd saves,
    parameters (not activations) and storages in `seen` left out."""
    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params and id(base) not in seen:
            saved[id(base)] = base.numel() * base.element_size()
        return t
    return pack


def _saved_bytes(spec, batch_size: int, checkpointed: bool, dtype=torch.float32) -> tuple[int, int]:
    """(bytes saved for backward by one forward, bytes of one block's output) on meta, with the
    model's floating-point parameters in `dtype`."""
    from ddlbench.models.spec import checkpoint_blocks, example_batch

    with torch.device("meta"):
        model = spec.build().to(dtype)
    if checkpointed:
        checkpoint_blocks(model)
    params = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}
    boundary = []
    blocks = model.blocks()
    hook = blocks[0].register_forward_hook(
        lambda m, i, o: boundary.append((o[0] if isinstance(o, tuple) else o).numel() * 4)) if blocks else None
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in example_batch(spec, batch_size, "meta").items()}
    with torch.autograd.graph.saved_tensors_hooks(_saver(params, saved), lambda t: t):
        model(**batch)
    if hook is not None:
        hook.remove()
    return sum(saved.values()), (boundary[0] if boundary else 0)


def _per_piece(spec, batch_size: int, dtype) -> tuple[list[tuple[float, int]], int]:
    """[(forward FLOPs, bytes saved for backward)] of each pipeline piece for one batch on meta,
    the pieces applied in order as the pipeline stages apply them (the last one with the loss),
    and the bytes of the last piece's output (GPT-2: the logits)."""
    from ddlbench.models.pipeline import loss_function, pieces
    from ddlbench.models.spec import example_batch

    with torch.device("meta"):
        model = spec.build().to(dtype)
    params = {id(p) for p in model.parameters()}
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in example_batch(spec, batch_size, "meta").items()}
    x, loss, plist = batch["input_ids" if "input_ids" in batch else "images"], loss_function(model), pieces(model)
    out, seen = [], set()       # a tensor two pieces save (one's output, the next one's input) counts once
    for i, piece in enumerate(plist):
        saved: dict[int, int] = {}
        counter = FlopCounterMode(display=False)
        with torch.autograd.graph.saved_tensors_hooks(_saver(params, saved, seen), lambda t: t), counter:
            x = piece(x)
            if i == len(plist) - 1:
                loss(x, batch["labels"])
        seen.update(saved)
        out.append((float(counter.get_total_flops()), sum(saved.values())))
    return out, x.numel() * x.element_size()


def pieces_profile(spec, dtype=torch.float32) -> tuple[tuple[Piece, ...], int]:
    """Piece of every pipeline piece: parameters (a tied weight in each piece that uses it), the
    tensor-parallel plan's share of them, forward FLOPs and saved bytes per sample (slopes
    between batch 2 and 4); and the model's output bytes per sample."""
    from ddlbench.models.pipeline import pieces, tied_parameters
    from ddlbench.models.spec import count_params
    from ddlbench.models.tensor_parallel import split_param_count

    with torch.device("meta"):
        plist = pieces(spec.build())
    tied = [0] * len(plist)
    for p, idx in tied_parameters(plist):
        for i in idx:
            tied[i] += p.numel()
    (two, out2), (four, out4) = _per_piece(spec, 2, dtype), _per_piece(spec, 4, dtype)
    return tuple(Piece(params=count_params(piece), split_params=split_param_count(piece), tied_params=tied[i],
                       flops=(four[i][0] - two[i][0]) / 2, activation_bytes=(four[i][1] - two[i][1]) // 2)
                 for i, piece in enumerate(plist)), (out4 - out2) // 2


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def profile(model_cfg, precision: str = "fp32") -> ModelProfile:
    """At bf16/fp16 the activations are counted with the model in that dtype: what DeepSpeed's
    2-byte engine saves; autocast keeps a few in fp32 (norms, softmax, the loss), so for autocast
    frameworks this is a lower bound."""
    from ddlbench.models.registry import build
    from ddlbench.models.spec import count_params

    spec = build(model_cfg, "cpu")
    with torch.device("meta"):
        model = spec.build()
    blocks = model.blocks()
    dtype = DTYPES[precision]
    full2, out2 = _saved_bytes(spec, 2, False, dtype)
    full4, _ = _saved_bytes(spec, 4, False, dtype)
    ck2, _ = _saved_bytes(spec, 2, True, dtype) if blocks else (full2, 0)
    ck4, _ = _saved_bytes(spec, 4, True, dtype) if blocks else (full4, 0)
    pieces, output = pieces_profile(spec, dtype)
    return ModelProfile(
        params=count_params(model),
        largest_block_params=max((count_params(b) for b in blocks), default=count_params(model)),
        blocks=max(len(blocks), 1),
        activation_bytes_per_sample=(full4 - full2) // 2,
        checkpointed_bytes_per_sample=(ck4 - ck2) // 2,
        boundary_bytes_per_sample=out2 // 2,
        pieces=pieces,
        output_bytes_per_sample=output,
        largest_weight_params=max((p.numel() for p in model.parameters()), default=0))
