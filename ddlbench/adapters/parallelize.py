"""Parallelisms as functions that every strategy applies to its model the same way, in one order
(torchtitan's parallelize_llama):

    apply_tensor_parallel -> apply_expert_parallel -> apply_checkpointing -> apply_compile -> apply_fully_shard

Tensor parallelism first (it replaces modules), activation checkpointing per block on what it
left, torch.compile per block (run.compile), FSDP2 last over the blocks and the root. A strategy
applies the ones it uses; none of them times anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import nn

from ddlbench.adapters.common import batch_norms
from ddlbench.adapters.precision import DTYPES


def apply_tensor_parallel(model: nn.Module, tp_mesh, sequence_parallel: bool = False, loss_parallel: bool = False,
                          shard_embedding: bool = False) -> int:
    """The Megatron-style plan on every block (ddlbench/models/tensor_parallel.py), with sequence
    parallelism and loss parallelism (the head over the vocabulary) where asked, a pipeline stage's embedding
    row-wise under SP with `shard_embedding`; the block count."""
    from ddlbench.models.tensor_parallel import apply_tensor_parallel as plan
    return plan(model, tp_mesh, sequence_parallel, loss_parallel, shard_embedding)


def apply_expert_parallel(model: nn.Module, ep_mesh) -> int:
    """Experts sharded over the `ep` ranks, tokens dispatched and combined by all-to-all
    (ddlbench/models/moe.py, torchtitan's ExpertParallel); the experts each rank keeps per layer."""
    from ddlbench.models.moe import shard_experts
    return shard_experts(model, ep_mesh.get_group(), ep_mesh.size(), ep_mesh.get_local_rank())


def apply_checkpointing(model: nn.Module, policy: str = "full") -> int:
    """Activation checkpointing of the blocks under `policy` (ddlbench/models/checkpointing.py); how many."""
    from ddlbench.models.checkpointing import apply
    return apply(model, policy)


def float8_eligible(fqn: str, in_features: int, out_features: int) -> bool:
    """torchtitan's float8 filter: a linear layer whose dimensions are multiples of 16 (the
    float8 matmul's need), the output projection excepted (lm_head: its accuracy matters most and
    the vocabulary rarely divides)."""
    return fqn.rsplit(".", 1)[-1] not in ("lm_head", "output") and in_features % 16 == 0 and out_features % 16 == 0


def apply_float8(model: nn.Module) -> dict:
    """run.float8: every eligible nn.Linear becomes torchao's Float8Linear (tensorwise dynamic
    scaling: the inputs, weights and output gradients cast to float8 per tensor at each matmul,
    bf16 elsewhere), before tensor parallelism, compile and the framework's wrapper, as
    torchtitan's float8 converter does. FSDP's float8 all-gather is left off (bf16 all-gather).
    Returns what was done, for the record."""
    import torchao
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    linears = {fqn: m for fqn, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen = [fqn for fqn, m in linears.items() if float8_eligible(fqn, m.in_features, m.out_features)]
    config = Float8LinearConfig()
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda m, fqn: float8_eligible(fqn, m.in_features, m.out_features))
    return {"converter": f"torchao {torchao.__version__} convert_to_float8_training", "scaling": "tensorwise dynamic",
            "converted": len(chosen), "kept": sorted(set(linears) - set(chosen)),
            # their weights: what runs as float8 matmuls (ddlbench/metrics/mfu.py, float8_share)
            "converted_params": sum(linears[f].in_features * linears[f].out_features for f in chosen),
            "fsdp_float8_all_gather": config.enable_fsdp_float8_all_gather}


def apply_compile(model: nn.Module) -> str:
    """torch.compile on every block, in place (Module.compile: names and parameters unchanged), as
    torchtitan compiles each transformer block before FSDP: the repeated structure compiles once
    and reuses its graph, and the wrappers (FSDP2's hooks, DDP's reducer) stay outside the graphs.
    Compilation happens at the first forward: warm-up, never in the measured window. Returns what
    was done, for the record."""
    blocks = model.blocks()
    for block in blocks:
        block.compile()
    return f"torch.compile per block ({len(blocks)} blocks, Module.compile, before the wrapper)"


@dataclass(frozen=True)
class Sharded:
    """What apply_fully_shard did, for the strategy's record."""
    units: int                    # fully_shard units (blocks + the root)
    fp32_units: int               # fully_shard units of batch norms kept in fp32
    mp_policy: Optional[object]   # the MixedPrecisionPolicy, or None at fp32
    fp32_layers: int = 0          # batch-norm layers in them
    made_contiguous: int = 0      # parameters made contiguous first (channels_last conv weights)

    def precision_summary(self, where: str = "") -> str:
        mp = self.mp_policy
        return f"MixedPrecisionPolicy(param_dtype={mp.param_dtype}, reduce_dtype={mp.reduce_dtype}){where}"

    def mp_record(self) -> Optional[dict]:
        mp = self.mp_policy
        return None if mp is None else {"param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype)}


def apply_fully_shard(model: nn.Module, mesh, precision: str, *, reduce_dtype: Literal["fp32", "param"] = "fp32",
                      reshard_after_forward: bool = True, wrap: Literal["blocks", "root"] = "blocks",
                      cpu_offload: bool = False, batch_norm_units: Literal["one", "per_layer"] = "one",
                      experts: tuple = (), experts_mesh=None, blocks: Optional[list] = None) -> Sharded:
    """FSDP2 (torch.distributed.fsdp.fully_shard) per block (wrap=blocks) and at the root, over
    `mesh`. At bf16/fp16 precision is FSDP2's MixedPrecisionPolicy (parameters in the run's dtype,
    gradients reduced in fp32 or that dtype), not autocast. BatchNorm layers get fp32 units of their
    own, as FSDP1's MixedPrecision does by default (_module_classes_to_ignore_mixed_precision):
    with bf16 parameters and fp32 running statistics cuDNN's batch norm fails in backward (seen on
    an H100); inputs stay in the compute dtype (cast_forward_inputs=False). `batch_norm_units`: all
    BatchNorms in one fp32 unit (one all-gather and one reduce-scatter for all of them: ResNet-50 has
    53) or one unit each (FSDP1's way: 53 of each, which made FSDP2 ResNet-50 4x slower than DDP on an
    H100). FSDP2 shards contiguous parameters only: channels_last conv weights (vision on CUDA) are
    made contiguous first (inputs stay channels_last; cuDNN converts the weights); found on an H200.
    `experts` (expert parallelism): every MoE layer's experts a unit of its own over `experts_mesh`
    (the data-parallel ranks that hold the same experts), first, as torchtitan shards them (FSDP2
    averages their gradients over experts_mesh only: the strategy divides by the ep ranks too).
    `blocks`: the units below the root where `model` has no blocks() of its own (a pipeline stage's)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    made_contiguous = 0
    for p in model.parameters():
        if not p.is_contiguous():
            p.data, made_contiguous = p.data.contiguous(), made_contiguous + 1

    mp = None
    if precision != "fp32":
        dtype = DTYPES[precision]
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if reduce_dtype == "fp32" else dtype)
    kw: dict = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
    if mp is not None:
        kw["mp_policy"] = mp
    if cpu_offload:
        # pinned host memory needs a CUDA driver; on CPU-only ranks the path runs unpinned
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")
    fp32_units = batch_norms(model) if mp is not None else []
    fp32 = {**kw, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                                     cast_forward_inputs=False)}
    if fp32_units and batch_norm_units == "one":
        fully_shard(fp32_units, **fp32)      # one unit: a list of modules grouped for communication
    else:
        for bn in fp32_units:
            fully_shard(bn, **fp32)
    for unit in experts:
        fully_shard(unit, **{**kw, "mesh": experts_mesh})
    if blocks is None:
        blocks = model.blocks() if wrap == "blocks" else []
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return Sharded(units=len(blocks) + 1 + len(experts), fp32_units=(min(1, len(fp32_units)) if batch_norm_units == "one"
                                                      else len(fp32_units)),
                   mp_policy=mp, fp32_layers=len(fp32_units), made_contiguous=made_contiguous)
