"""One gloo rank: build FRAMEWORK's adapter on resnet18_tiny at bf16, train one step, and print
(JSON) each batch-norm layer's parameter and running-statistics dtypes as its forward saw them.
cuDNN's batch norm needs the two equal (its input may be bf16 with fp32 parameters): on an H100
FSDP2 and DeepSpeed 0.19 at bf16 failed in backward with "Expected running_mean to have type
BFloat16 but got Float". Without the fix this script fails on CPU too ("expected scalar type
BFloat16 but found Float"); no run in the suite trained a vision model at bf16 under them.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=P RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 python tests/rank_batch_norm_dtypes.py fsdp_full
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ddlbench import models  # noqa: E402
from ddlbench.adapters.base import RankContext  # noqa: E402
from ddlbench.adapters.common import batch_norms  # noqa: E402
from ddlbench.adapters.optim import build_optimizer_factory  # noqa: E402
from ddlbench.planning.config import plan_from_overrides  # noqa: E402
from ddlbench.rank.quality import batch_source  # noqa: E402

dist.init_process_group("gloo")
plan = plan_from_overrides([f"framework={sys.argv[1]}", "model=resnet18_tiny", "launcher.nproc=1",
                            "run.precision=bf16", "run.global_batch=4", *sys.argv[2:]])
torch.manual_seed(0)
ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", precision="bf16")
spec = models.build(plan.cfg.model, "cpu")
seen = {}


def build():
    model = spec.build()
    for i, bn in enumerate(batch_norms(model)):
        bn.register_forward_pre_hook(lambda m, args, i=i: see(i, m))
    return model


def see(i, bn) -> None:
    """After the wrapper's own pre-forward hooks (registered later): what the kernel gets."""
    seen.setdefault(i, [str(bn.weight.dtype), str(bn.running_mean.dtype)])


adapter = plan.variant.strategy_class()(plan.variant, ctx, plan.dims)
adapter.setup(build, build_optimizer_factory(plan.cfg.optim))
batches, _ = batch_source(None, plan.cfg, spec, plan.dims, 0, ctx.device)
out = adapter.train_step(next(batches))
print(json.dumps({"layers": [seen[i] for i in sorted(seen)], "native_config": adapter.describe()["native_config"],
                  "loss": float(out.loss)}, default=str))
dist.destroy_process_group()
