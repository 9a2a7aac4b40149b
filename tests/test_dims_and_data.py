"""ParallelDims validation and the world-size-independent synthetic data."""
import pytest
import torch

from ddlbench import models
from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides
from ddlbench.settings.dims import resolve_dims


def test_dims_derive_dp_and_accumulation():
    d = resolve_dims(world_size=4, global_batch=32, micro_batch=None)
    assert (d.dp, d.micro_batch, d.grad_accum, d.local_batch) == (4, 8, 1, 8)
    d = resolve_dims(world_size=4, global_batch=32, micro_batch=2)
    assert (d.micro_batch, d.grad_accum) == (2, 4)
    d = resolve_dims(world_size=8, global_batch=16, micro_batch=None, tp=2, pp=2)
    assert d.dp == 2 and d.micro_batch == 8


@pytest.mark.parametrize("kwargs,msg", [
    (dict(world_size=3, global_batch=8, micro_batch=None), "not divisible by dp=3"),
    (dict(world_size=2, global_batch=8, micro_batch=3), "dp ranks x run.micro_batch = 2 x 3"),
    (dict(world_size=6, global_batch=8, micro_batch=None, tp=4), "not divisible by tp*pp"),
    (dict(world_size=0, global_batch=8, micro_batch=None), "must be >= 1"),
])
def test_dims_reject(kwargs, msg):
    with pytest.raises(ConfigError, match=msg.replace("*", r"\*")):
        resolve_dims(**kwargs)


@pytest.mark.parametrize("model", ["gpt2_tiny", "resnet18_tiny"])
def test_global_batch_independent_of_world_size(model):
    spec = models.build(plan_from_overrides([f"model={model}"]).cfg.model)
    one = models.SyntheticData(spec, seed=3, global_batch=8, dp_rank=0, local_batch=8,
                               pool_batches=2, device=torch.device("cpu"))
    halves = [models.SyntheticData(spec, seed=3, global_batch=8, dp_rank=r, local_batch=4,
                                   pool_batches=2, device=torch.device("cpu")) for r in range(2)]
    for step in range(3):
        whole = one.batch(step)
        for key in whole:
            joined = torch.cat([h.batch(step)[key] for h in halves])
            assert torch.equal(whole[key], joined)
    assert not torch.equal(one.batch(0)[key], one.batch(1)[key])  # distinct batches in the pool
    other_seed = models.SyntheticData(spec, seed=4, global_batch=8, dp_rank=0, local_batch=8,
                                      pool_batches=1, device=torch.device("cpu"))
    assert not torch.equal(other_seed.batch(0)[key], one.batch(0)[key])
