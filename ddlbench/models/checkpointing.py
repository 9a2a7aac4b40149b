"""Activation checkpointing as a choice (`framework.options.activation_checkpointing`), alike for
every framework that applies it, torchtitan's policies:

    none                nothing recomputed
    full                every block: its input kept, its forward run again in backward
    selective_layer:K   every K-th block as `full` (torchtitan's ac_freq: blocks K, 2K, ... counting from 1)
    selective_op        every block under torch's selective checkpointing (create_selective_checkpoint_contexts)
                        with torchtitan's per-op policy: the outputs of the matmuls and of the fused attention
                        kernels are saved, except every second matmul, and the rest (norms, activations,
                        elementwise ops) is recomputed

true and false (the option's old spelling) are full and none. Applied before compile and before the
framework's wrapper, as torchtitan does; the model's blocks are wrapped in place (torch's
non-reentrant checkpoint_wrapper).
"""
from __future__ import annotations

from collections import defaultdict
from functools import cache, partial

from pydantic import BeforeValidator
from typing_extensions import Annotated

POLICIES = ("none", "full", "selective_layer:K", "selective_op")


def normalize(value) -> str:
    """The policy named by an option value (true/false as full/none); ValueError otherwise."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("false", "none", "")):
        return "none"
    if value is True or (isinstance(value, str) and value.lower() in ("true", "full")):
        return "full"
    if isinstance(value, str) and value == "selective_op":
        return value
    if isinstance(value, str) and value.startswith("selective_layer:"):
        k = value.partition(":")[2]
        if k.isdigit() and int(k) >= 1:
            return f"selective_layer:{int(k)}"
    raise ValueError(f"activation_checkpointing must be one of {', '.join(POLICIES)} (K a whole number >= 1), "
                     f"or true/false; got {value!r}")


Policy = Annotated[str, BeforeValidator(normalize)]


def layer_every(policy: str) -> int:
    """K of selective_layer:K; 1 for full; 0 where no block is checkpointed whole."""
    if policy == "full":
        return 1
    if policy.startswith("selective_layer:"):
        return int(policy.partition(":")[2])
    return 0


def checkpointed_blocks(policy: str, blocks: int) -> int:
    """How many of `blocks` a policy recomputes whole (selective_op: none whole, all in part)."""
    k = layer_every(policy)
    return blocks // k if k else 0


@cache        # made once: every checkpointed block's forward asks for a context
def _save_list():
    import torch
    ops = [torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops._c10d_functional.reduce_scatter_tensor.default]
    cudnn = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    return set(ops + ([cudnn.default] if cudnn is not None else []))


def op_policy(meta: dict, save: set):
    """torchtitan's per-op policy: save what `save` lists, except every second mm (counted apart
    in forward and in its recompute, so both make the same choices)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def selective_op_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(op_policy(defaultdict(int), _save_list()))


def _respect_hooks() -> dict:
    import inspect

    from torch.utils.checkpoint import checkpoint
    return ({"respect_saved_tensors_hooks": True}
            if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters else {})


def _wrapper(policy: str):
    """The checkpoint wrapper a policy applies to each block it checkpoints."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    if policy == "selective_op":
        # what SAC saves goes through saved_tensors_hooks like any saved tensor (the profile counts it
        # there), where torch has the choice (2.14; older ones bypass the hooks, the default there)
        return partial(checkpoint_wrapper, context_fn=selective_op_context, preserve_rng_state=False,
                       **_respect_hooks())
    return checkpoint_wrapper


def chosen_blocks(policy: str, blocks: int) -> list[int]:
    """Which blocks (from 0) a policy checkpoints: every one (full, selective_op), every K-th
    (selective_layer:K: blocks K-1, 2K-1, ...), none."""
    policy = normalize(policy)
    if policy == "none":
        return []
    k = 1 if policy == "selective_op" else layer_every(policy)
    return [i for i in range(blocks) if (i + 1) % k == 0]


def apply(model, policy: str) -> int:
    """Wrap the blocks of `model` (an nn.Module with blocks()) the policy checkpoints (model.blocks(), in place); how many."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    policy = normalize(policy)
    blocks = model.blocks()
    chosen = {id(blocks[i]) for i in chosen_blocks(policy, len(blocks))}
    if chosen:
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=_wrapper(policy), check_fn=lambda m: id(m) in chosen)
    return len(chosen)


def apply_to_stages(stages: list, ranges: list, n_pieces: int, policy: str) -> int:
    """Pipeline stages (nn.Sequential of the model's pieces, `ranges` their piece indices): each block
    piece the policy checkpoints wrapped in place, blocks numbered over the whole model (its pieces
    between the embedding and the head), so a stage checkpoints what the whole model would; how many."""
    policy = normalize(policy)
    chosen = {i + 1 for i in chosen_blocks(policy, n_pieces - 2)}
    wrap, n = _wrapper(policy), 0
    for stage, pieces in zip(stages, ranges):
        for j, i in enumerate(pieces):
            if i in chosen:
                stage[j] = wrap(stage[j])
                n += 1
    return n


def recompute_label(policy: str) -> str | None:
    """result.json's flops.recompute: what backward recomputes ('activation checkpointing per
    block' for full, as before the policies)."""
    policy = normalize(policy)
    return {"none": None, "full": "activation checkpointing per block"}.get(policy, f"activation checkpointing: {policy}")


def describe(policy: str) -> str | None:
    """The policy as the record states it (native_config)."""
    policy = normalize(policy)
    return {"none": None, "full": "non-reentrant checkpoint_wrapper per block",
            "selective_op": "per block, torch selective checkpointing with torchtitan's op policy (save matmuls "
                            "but every second one, and fused attention; recompute the rest)"}.get(
        policy, f"non-reentrant checkpoint_wrapper on every {layer_every(policy)}-th block ({policy})")
