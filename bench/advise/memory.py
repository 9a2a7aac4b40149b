"""Peak memory per rank of a training step, estimated per strategy (pure; hand-checked in
tests/test_advise.py). Bytes, at the precision the runs train in (fp32, or bf16/fp16):

    model state  = params + gradients + optimizer state, each divided by the ranks that shard it
                   (ZeRO paper, section 3: stage 1 shards optimizer states, 2 also gradients,
                   3 / FSDP full shard also parameters), after dividing the model by tp x pp
    activations  = what autograd saves for backward per sample (measured on the meta device,
                   bench.advise.profile) x micro-batch x micro-batches in flight, / tp;
                   with activation checkpointing: the block inputs for every layer plus one
                   block's full activations (its recompute in backward)
    buffers      = what the strategy adds on top: DDP's gradient buckets when they are not views
                   of the gradients, Horovod's fusion buffer, ZeRO-1/2's fp32 gradient partition
                   and flat reduce bucket, the unsharded parameters and gradients of the largest
                   unit that FSDP / ZeRO-3 gather (prefetch: two units), the pipeline's
                   send/receive buffers.
    at bf16/fp16   DeepSpeed's engine holds 2-byte parameters and gradients and an fp32 master
                   copy in its optimizer (4 B/param more); FSDP2 keeps fp32 shards and gathers
                   units in the 2-byte param_dtype; autocast frameworks keep fp32 parameters and
                   gradients plus autocast's cached 2-byte weight copies; activations are
                   profiled with the model in that dtype (bench.advise.profile).
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.metrics.memory import optimizer_state_bytes_per_param

MiB = 1 << 20
HOROVOD_FUSION_BYTES = 128 * MiB        # Horovod 0.28's default fusion buffer (bench.adapters.horovod.DEFAULT_FUSION_THRESHOLD_MB)
DS_REDUCE_BUCKET_ELEMS = 500_000_000    # DeepSpeed zero_optimization.reduce_bucket_size default


@dataclass(frozen=True)
class ModelProfile:
    """What the estimator needs to know about a model (bench.advise.profile measures it)."""
    params: int
    largest_block_params: int
    blocks: int
    activation_bytes_per_sample: int        # saved for backward, no checkpointing
    checkpointed_bytes_per_sample: int      # saved for backward with every block checkpointed
    boundary_bytes_per_sample: int          # one block's output (pipeline p2p, tensor-parallel all-reduce)


@dataclass(frozen=True)
class Layout:
    framework: str          # conf/framework name
    dp: int                 # data-parallel ranks (sharding group of ZeRO / FSDP)
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    checkpointing: bool = False
    shard: int = 0          # ranks that shard the model state (FSDP hybrid); 0 = all dp ranks


# framework -> (shard optimizer, shard gradients, shard parameters) over the data-parallel ranks
SHARDING = {
    "ddp": (False, False, False), "horovod": (False, False, False),
    "fairscale_oss": (True, True, False),         # ShardedDataParallel: gradients to their owner
    "fairscale_oss_ddp": (True, False, False),
    "deepspeed_zero0": (False, False, False), "deepspeed_zero1": (True, False, False),
    "deepspeed_zero2": (True, True, False), "deepspeed_zero3": (True, True, True),
    "fsdp_full": (True, True, True),
    "fsdp_grad_op": (True, True, False),            # parameters stay unsharded between forward and backward
    "fsdp_hybrid": (True, True, True),              # over the shard group, replicated across groups
    "tensor_parallel": (True, True, True),          # tp slices, FSDP2 over dp_shard
    "pipeline_1f1b": (False, False, False), "pipeline_gpipe": (False, False, False),
}


def in_flight(layout: Layout) -> int:
    """Micro-batches whose activations a rank holds at once: 1F1B's first stage pp, GPipe all."""
    if layout.pp == 1:
        return 1
    if layout.framework == "pipeline_gpipe":
        return layout.grad_accum
    return min(layout.pp, layout.grad_accum)


FSDP2_BASED = ("fsdp_full", "fsdp_grad_op", "fsdp_hybrid", "tensor_parallel")


def estimate(layout: Layout, model: ModelProfile, optimizer: str = "adamw", momentum: float = 0.0,
             precision: str = "fp32") -> dict:
    """{'params', 'grads', 'optimizer', 'activations', 'buffers', 'total'} bytes on the busiest rank."""
    if layout.framework not in SHARDING:
        raise ValueError(f"no memory model for framework {layout.framework!r}")
    fw = layout.framework
    shard_o, shard_g, shard_p = SHARDING[fw]
    p = model.params / (layout.tp * layout.pp)
    low = precision in ("bf16", "fp16")
    engine_low = low and fw.startswith("deepspeed")        # the engine's own 2-byte model
    state = 2 if engine_low else 4                         # parameter and gradient bytes
    k = optimizer_state_bytes_per_param(optimizer, momentum, fp32_master_copy=engine_low)
    n = layout.shard or layout.dp

    def part(nbytes: int, sharded: bool) -> float:
        return nbytes * p / (n if sharded else 1)
    out = {"params": part(state, shard_p), "grads": part(state, shard_g), "optimizer": part(k, shard_o)}

    per_sample = model.activation_bytes_per_sample
    if layout.checkpointing:
        per_sample = model.checkpointed_bytes_per_sample + model.activation_bytes_per_sample / max(model.blocks, 1)
    out["activations"] = per_sample * layout.micro_batch * in_flight(layout) / (layout.tp * layout.pp)

    unit = (2 if low else 4) * model.largest_block_params / layout.tp    # gathered in the param dtype
    buffers = 0.0
    if low and not engine_low and fw not in FSDP2_BASED:
        buffers = 2 * p                     # autocast's cached 2-byte copies of the weights
    if fw == "horovod" and n > 1:
        buffers += min(HOROVOD_FUSION_BYTES, 4 * p)
    elif fw in ("deepspeed_zero1", "deepspeed_zero2") and n > 1:
        # fp32 partition of the averaged gradients + the flat reduce bucket (gradient dtype)
        buffers += 4 * p / n + min(state * DS_REDUCE_BUCKET_ELEMS, state * p)
    elif (fw in ("deepspeed_zero3", "fsdp_full", "fsdp_hybrid", "tensor_parallel") and n > 1):
        buffers += 2 * 2 * unit             # two units gathered (prefetch), params + their gradients
    elif fw == "fsdp_grad_op" and n > 1:
        buffers += 2 * unit
    if layout.pp > 1:
        buffers += 2 * 2 * model.boundary_bytes_per_sample * layout.micro_batch / layout.tp   # send + recv, fwd + bwd
    out["buffers"] = buffers
    out = {k2: int(round(v)) for k2, v in out.items()}
    out["total"] = sum(out.values())
    return out
