"""Cost models of the framework variants in conf/framework, on hand-made parallel dims (no
Hydra run, no process group): for the hand-checked tests of advise and of the adapters' cost models."""
from __future__ import annotations

import functools
import importlib

from ddlbench.adapters.cost import ModelProfile
from ddlbench.settings.dims import ParallelDims

# params 1000, largest block 200, 4 blocks (5 units); per sample: 1000 B saved, 100 B checkpointed, 50 B block output
PROF = ModelProfile(params=1000, largest_block_params=200, blocks=4, activation_bytes_per_sample=1000,
                    checkpointed_bytes_per_sample=100, boundary_bytes_per_sample=50)


@functools.cache
def variant(framework: str):
    """(the Variant class, its options as the yaml sets them)."""
    from ddlbench.planning.config import compose_raw
    raw = compose_raw([f"framework={framework}", "model=gpt2_tiny"])["framework"]
    module, name = raw["adapter"].split(":")
    return getattr(importlib.import_module(module), name), dict(raw.get("options") or {})


def dims(dp: int, tp: int = 1, pp: int = 1, mb: int = 2, ga: int = 1, dp_shard: int = 1) -> ParallelDims:
    return ParallelDims(world_size=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batch=mb, grad_accum=ga,
                        global_batch=dp * mb * ga, dp_shard=dp_shard)


def cost_of(framework: str, dp: int, tp: int = 1, pp: int = 1, mb: int = 2, ga: int = 1, precision: str = "fp32",
            model: ModelProfile = PROF, per_node: int | None = None, **edits):
    cls, options = variant(framework)
    shard = dp if cls.name in ("tensor_parallel", "expert_parallel") else 1   # FSDP2 over the dp ranks of each tp slice
    return cls(cls.Options(**{**options, **edits})).cost_model(dims(dp, tp, pp, mb, ga, shard), model, precision,
                                                              per_node)
