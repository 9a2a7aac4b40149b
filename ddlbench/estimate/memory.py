"""Peak memory per rank of a training step, estimated from the framework's own cost model
(ddlbench.adapters.cost.CostModel, declared by its adapter) and the model's profile (pure;
hand-checked in tests/test_advise.py and tests/test_cost_model.py). Bytes:

    model state  = parameters + gradients + optimizer state on the rank: its model piece
                   (params / (tp x pp)) at the bytes the framework keeps (DeepSpeed's 2-byte engine,
                   fp32 master copies), each part divided by the ranks that shard it (ZeRO paper,
                   section 3); parts offloaded to the host are reported apart (`host`)
    activations  = what autograd saves for backward per sample (measured on the meta device,
                   ddlbench.estimate.profile) x micro-batch x micro-batches in flight x the rank's share;
                   with activation checkpointing: the block inputs for every layer plus one
                   block's full activations (its recompute in backward)
    buffers      = what the framework adds (its cost model's `buffers`: buckets, fusion buffers,
                   gathered units, send/receive buffers, autocast's weight copies)
    temporaries  = what a step adds at its peak beyond the parts above (found with torch's MemTracker
                   on real runs of every strategy: benchmarks/memory_check.py, docs/memory-check.md).
                   Backward's first gradients arrive while every activation is still saved: two
                   output-sized gradients (through the loss's log-softmax; GPT-2: the logits) or the
                   largest weight's gradient. A weight used twice on the rank (GPT-2's tied embedding
                   and head) gets two contributions that autograd sums out of place at the end of
                   backward, when the activations are freed: 2 extra copies (3 where gradients live
                   in preallocated storage); AdamW's step adds its own temporaries. The larger phase
                   counts, net of the gradients and activations counted whole: gradients that do not
                   exist before backward are made as activations are freed, so the net can be negative.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddlbench.adapters.cost import CostModel, ModelProfile

# the caching allocator's reserved peak over the tensors' allocated peak: the median over every
# successful record of reports/gpu-h200/2026-11-26 and -27 (one H200: 47 records, 1.02-1.29; FSDP2 on
# Llama 1.09-1.26), tests/test_memory_check.py recomputes it. The 5 records of 2026-11-30 (4 of them
# FSDP2 in windows of 10 s or more, median 1.158) are not in it: with them the median is 1.128 (1.13),
# which would move every published row's memory by +0.9%. What a published "memory" that is the
# reserved peak (torchtitan's logs) is compared with; `fits` stays on the allocated estimate.
RESERVED_OVER_ALLOCATED = 1.12

__all__ = ["Layout", "ModelProfile", "estimate"]


@dataclass(frozen=True)
class Layout:
    framework: str          # conf/framework name
    dp: int                 # data-parallel ranks
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    checkpointing: bool | str = False    # a policy (ddlbench/models/checkpointing.py); true = full
    shard: int = 0          # ranks that shard the model state when fewer than dp (FSDP hybrid); 0 = dp
    ep: int = 1             # expert-parallel ranks (MoE models under expert_parallel)
    cp: int = 1             # ranks that split each sequence (ring attention, Ulysses): 1/cp of its output each


def activation_bytes(layout: Layout, model: ModelProfile, cost: CostModel) -> float:
    """Saved per sample under the layout's checkpointing policy, plus what backward recomputes at
    once (one block's activations) where a policy recomputes:
        none                full
        full                checkpointed (every block's input) + one block's full activations
        selective_layer:K   full - (blocks // K) x (full - checkpointed) / blocks, + one block's
        selective_op        its measured saved bytes + one block's recomputed rest
    """
    from ddlbench.models.checkpointing import checkpointed_blocks, normalize
    full, ckpt = model.activation_bytes_per_sample, model.checkpointed_bytes_per_sample
    sel = model.selective_op_bytes_per_sample
    if cost.autocast and model.autocast_activation_bytes_per_sample:   # mixed: bounded by the fp32 figures
        full, ckpt = model.autocast_activation_bytes_per_sample, model.autocast_checkpointed_bytes_per_sample
        sel = model.autocast_selective_op_bytes_per_sample or sel
    blocks = max(model.blocks, 1)
    policy = normalize(layout.checkpointing)
    per_sample = full
    if policy == "selective_op" and sel:
        per_sample = sel + (full - sel) / blocks
    elif policy != "none":
        n = checkpointed_blocks(policy, blocks) if policy != "selective_op" else blocks
        per_sample = full - n * (full - ckpt) / blocks + (full / blocks if n else 0.0)
    return per_sample * layout.micro_batch * cost.in_flight * cost.activation_share


def optimizer_step_bytes(model: ModelProfile, cost: CostModel, optimizer: str, device: str) -> float:
    """Temporaries of torch's AdamW step (measured with MemTracker: tests/test_memory_check.py): on
    CPU it updates one tensor at a time (single-tensor path) and makes two of that tensor's size
    (sqrt of exp_avg_sq and its quotient): 2 x the largest weight (its shard where the optimizer
    is sharded); on CUDA the foreach path takes the square roots of every tensor at once: 1 x the
    parameters it updates. SGD updates in place; an offloaded optimizer steps on the host."""
    if optimizer != "adamw" or cost.offload_optimizer:
        return 0.0
    shard = max(cost.shard_ranks, 1) if cost.shard_optimizer else 1
    if device == "cpu":
        return 2 * 4.0 * (cost.largest_weight or model.largest_weight_params) / shard
    return 4.0 * cost.piece / shard


def temporary_bytes(layout: Layout, model: ModelProfile, cost: CostModel, activations: float,
                    grads: float, step: float = 0.0) -> float:
    """What a training step adds at its peak beyond the gradients and activations counted whole;
    negative where the two never all live at once (gradients made only as activations are freed).
    Start of backward: activations + the first gradients (two output-sized ones — of the rank's
    1/cp of the sequence where ring attention or Ulysses split it — or the largest weight's) + the
    gradients: all of them if they already exist (preallocated, or accumulating over micro-batches),
    else all but a tied embedding's, which backward reaches last (counting the others is
    conservative: a CNN makes its largest weights' gradients while the early layers' activations
    still live). End of backward and the optimizer step: the gradients + the
    tied weight's extra copies or the optimizer's temporaries (`step`), whichever is larger, + a
    copy of the gradients that the framework makes for its step (`cost.step_grad_copy_bytes`)."""
    made = cost.backward_grad_bytes or cost.grad_bytes
    # eager attention's backward makes a (T x T) gradient of the scores while most activations live
    scores = model.attention_scores_bytes_per_sample * layout.micro_batch / layout.tp
    output = model.output_bytes_per_sample * layout.micro_batch / layout.cp * cost.output_share
    first = max(2 * output, (cost.largest_weight or model.largest_weight_params) * made) + scores
    tied = model.tied_pair_params(layout.pp, layout.tp) * made
    held = cost.grads_preallocated or layout.grad_accum > 1
    start = activations + first + (grads if held else max(0.0, grads - tied))
    end = grads + max((3 if cost.grads_preallocated else 2) * tied, step) + cost.step_grad_copy_bytes * cost.piece
    return max(start, end) - grads - activations


def estimate(layout: Layout, model: ModelProfile, cost: CostModel, optimizer: str = "adamw",
             momentum: float = 0.0, device: str = "cuda") -> dict:
    """{'params', 'grads', 'optimizer', 'activations', 'temporaries', 'buffers', 'total', 'host'} bytes on the
    busiest rank ('total' is the device's; 'host': what the framework offloads), training on
    `device` ('cpu' or a GPU: the optimizer's temporaries differ). Where the ranks hold different parts of the
    model (`cost.per_rank`: a pipeline's), the rank whose total is largest ('rank': its index)."""
    if cost.per_rank:
        ranks = [estimate(layout, model, c, optimizer, momentum, device) for c in cost.per_rank]
        r = max(range(len(ranks)), key=lambda i: ranks[i]["total"])
        return {**ranks[r], "rank": r}
    out = cost.state_bytes(optimizer, momentum)
    host = 0.0
    offloaded = (["optimizer"] if cost.offload_optimizer else []) + (["params", "grads"] if cost.offload_params else [])
    for key in offloaded:
        host += out[key]
        out[key] = 0.0
    out["activations"] = activation_bytes(layout, model, cost)
    out["temporaries"] = temporary_bytes(layout, model, cost, out["activations"], out["grads"],
                                         optimizer_step_bytes(model, cost, optimizer, device))
    out["buffers"] = float(sum(cost.buffers.values()))
    out = {k2: int(round(v)) for k2, v in out.items()}
    out["total"] = sum(out.values())
    out["host"] = int(round(host))
    return out
