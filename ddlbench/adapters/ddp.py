"""PyTorch DistributedDataParallel.

Recommended settings (torch docs, "DDP notes"): gradient_as_bucket_view=True saves a copy of
every gradient; 25 MB buckets; optional communication hooks (fp16/bf16 compression, PowerSGD,
post-local SGD with periodic model averaging).
Mixed precision is autocast on the run's precision; parameters stay fp32.
"""
from __future__ import annotations

import inspect
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from ddlbench.adapters.base import Periodic, StepOut, Strategy
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, forward_backward
from ddlbench.adapters.cost import CostModel, MiB, StepRules, autocast_copies, buckets, split
from ddlbench.adapters.parallelize import apply_checkpointing, apply_compile, apply_float8
from ddlbench.adapters.variant import Abilities, Variant, payload_psi, taxonomy_labels
from ddlbench.errors import ConfigError
from ddlbench.metrics.comm import AnalyticComm
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac


class DDPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    bucket_cap_mb: float = Field(25.0, gt=0)
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    broadcast_buffers: bool = True
    find_unused_parameters: bool = False
    comm_hook: Literal["none", "fp16", "bf16", "powersgd", "post_local_sgd"] = "none"
    powersgd_rank: PositiveInt = 1
    powersgd_start_iter: NonNegativeInt = 2
    # post-local SGD (torch's PostLocalSGDState + PeriodicModelAverager): all-reduce gradients
    # over the world for local_sgd_warmup_steps, then only inside groups of local_sgd_group_size
    # ranks (1 = plain local SGD), and average the models over the world every local_sgd_period steps.
    local_sgd_period: PositiveInt = 4
    local_sgd_warmup_steps: NonNegativeInt = 2
    local_sgd_group_size: PositiveInt = 1
    activation_checkpointing: Policy = "none"   # none | full | selective_layer:K | selective_op (models/checkpointing.py)


class DDP(Variant):
    name = "ddp"
    Options = DDPOptions
    strategy = "ddlbench.adapters.ddp:DDPStrategy"

    def abilities(self):
        hook = self.options.comm_hook
        fake = {"fp16": "its compression hook reads the all-reduced tensor back, which a fake group does not give",
                "powersgd": "PowerSGD reads the all-reduced matrices back, which a fake group does not give",
                "post_local_sgd": "local SGD averages parameters every few steps; one step says little"}
        return Abilities(compiles=True, float8=True, fake_group=fake.get("fp16" if hook == "bf16" else hook),
                         step=StepRules("buckets", bucket_bytes=self.options.bucket_cap_mb * MiB), checkpoints=DCP)   # the hooks aside

    def taxonomy(self) -> dict:
        options = self.options
        hook = options.comm_hook
        if hook == "post_local_sgd":
            return taxonomy_labels("data", "periodic (post-local SGD)", "all-reduce (gradients, then model averaging)")
        return taxonomy_labels("data", "sync", "all-reduce", compression={
            "none": "none", "fp16": "fp16", "bf16": "bf16", "powersgd": f"low-rank (PowerSGD r={options.powersgd_rank})"}[hook])

    def check_config(self, cfg, dims) -> None:
        options = self.options
        if options.comm_hook == "powersgd" and options.powersgd_start_iter < 2:
            raise ConfigError("framework.options.powersgd_start_iter must be >= 2 "
                              "(torch PowerSGD requires vanilla all-reduce for the first steps)")
        if options.comm_hook == "post_local_sgd" and dims.world_size % options.local_sgd_group_size:
            raise ConfigError(f"framework.options.local_sgd_group_size={options.local_sgd_group_size} must divide "
                              f"the world size {dims.world_size}")

    def cost_model(self, dims, model, precision, per_node=None):
        """DDP's Reducer all-reduces every gradient bucket (bucket_cap_mb of fp32 gradients) once
        per step (no_sync on the other micro-batches); bucket_cap_mb is passed explicitly, so torch
        caps the first bucket at it too (its 1 MiB first bucket is for bucket_cap_mb=None); the fp16/bf16 hooks halve the payload;
        post-local SGD (after its warm-up) all-reduces gradients inside its groups and averages
        the flattened parameters over the world every local_sgd_period steps. PowerSGD's payload
        depends on every matrix's shape and rank: no cost model."""
        o = self.options
        if o.comm_hook == "powersgd":
            return None
        psi, dp = 4.0 * model.params, dims.dp
        buffers = autocast_copies(model.params, precision)
        if not o.gradient_as_bucket_view and dp > 1:
            buffers["gradient buckets (copies: gradient_as_bucket_view=false)"] = psi
        n = buckets(psi, o.bucket_cap_mb * MiB)
        if o.comm_hook == "post_local_sgd":
            traffic = (split("all_reduce", psi, n, o.local_sgd_group_size, what="gradients (local-SGD group)")
                       + split("all_reduce", psi, 1, dp, per_step=1 / o.local_sgd_period, what="parameters (average)"))
            source = ("post_localSGD_hook after its warm-up: gradients all-reduced inside groups of "
                      "local_sgd_group_size, PeriodicModelAverager averages the flat parameters every period")
        else:
            payload = psi * (0.5 if o.comm_hook in ("fp16", "bf16") else 1.0)
            traffic = split("all_reduce", payload, n, dp, what="gradients")
            source = ("DDP Reducer: one all-reduce per gradient bucket, once per step"
                      + (f" ({o.comm_hook} compression hook)" if o.comm_hook != "none" else ""))
        return CostModel(source, model.params, shard_ranks=dp, buffers=buffers, traffic=tuple(traffic),
                         grads_preallocated=o.gradient_as_bucket_view)

    def grad_reduce_dtype(self, precision: str) -> str:
        return {"fp16": "fp16", "bf16": "bf16", "powersgd": "fp32 (PowerSGD low-rank)"}.get(self.options.comm_hook, "fp32")

    def analytic_comm(self, dims, precision, params, per_node=None) -> AnalyticComm | None:
        if self.options.comm_hook != "none":
            return None
        return AnalyticComm(payload_psi(self, dims, precision, params, per_node),
                            "DDP Reducer: one all-reduce of every gradient bucket",
                            paper_psi=2.0, paper="ZeRO paper, data parallelism")


class DDPStrategy(Periodic, Strategy):
    def setup(self, build_model, build_optimizer) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        o = self.options
        model = build_on(build_model, self.ctx.device)
        self.float8 = apply_float8(model) if self.ctx.float8 else None   # before compile and the wrapper
        self.params = sum(p.numel() for p in model.parameters())
        if o.activation_checkpointing != "none":
            apply_checkpointing(model, o.activation_checkpointing)
        self.compiled = apply_compile(model) if self.ctx.compile else None
        bucket_cap_mb = o.bucket_cap_mb
        self._forced_single_bucket = None
        if o.comm_hook == "powersgd" and self.ctx.backend == "gloo":
            # PowerSGD hangs on gloo with more than one bucket: force one, and record why.
            model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
            bucket_cap_mb = max(bucket_cap_mb, model_mb + 1.0)
            self._forced_single_bucket = "PowerSGD on gloo hangs with >1 gradient bucket"
        self._bucket_cap_mb = bucket_cap_mb
        kwargs = dict(bucket_cap_mb=bucket_cap_mb,
                      gradient_as_bucket_view=o.gradient_as_bucket_view,
                      static_graph=o.static_graph, find_unused_parameters=o.find_unused_parameters)
        # torch >= 2.14 renamed broadcast_buffers to forward_sync_buffers
        sync_key = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
        kwargs[sync_key] = o.broadcast_buffers
        if self._forced_single_bucket:
            # DDP's first bucket is capped at 1 MiB unless given explicitly.
            kwargs["bucket_cap_mb_list"] = [int(bucket_cap_mb) + 1]
        if self.ctx.device.type == "cuda":
            kwargs["device_ids"] = [self.ctx.device.index]
        self.model = DDP(model, **kwargs)
        self._register_hook()
        self.optimizer = build_optimizer(self.model.parameters())
        if o.comm_hook == "post_local_sgd":
            from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
            from torch.distributed.optim import PostLocalSGDOptimizer
            self.optimizer = PostLocalSGDOptimizer(self.optimizer, PeriodicModelAverager(
                period=o.local_sgd_period, warmup_steps=o.local_sgd_warmup_steps))

    def _register_hook(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        o = self.options
        if o.comm_hook == "fp16":
            self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif o.comm_hook == "bf16":
            self.model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif o.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=o.powersgd_rank,
                start_powerSGD_iter=o.powersgd_start_iter)
            self.model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif o.comm_hook == "post_local_sgd":
            import torch.distributed as dist
            from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl
            subgroup, _ = dist.new_subgroups(group_size=o.local_sgd_group_size)
            state = pl.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                         start_localSGD_iter=o.local_sgd_warmup_steps)
            self.model.register_comm_hook(state, pl.post_localSGD_hook)
        # none: DDP's C++ built-in all-reduce, the fastest path

    def train_step(self, batch: dict) -> StepOut:
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self.model.no_sync)
        self.precision.step(self.optimizer)
        return StepOut(loss=loss)

    def _bucket_bytes(self, key: str = "bucket_sizes") -> list[int]:
        sizes = self.model._get_ddp_logging_data().get(key, "")
        return [int(s) for s in str(sizes).split(",") if s.strip()]

    def comm_probe_steps(self) -> int:
        return self.options.local_sgd_period if self.options.comm_hook == "post_local_sgd" else 1

    def describe(self) -> dict:
        o = self.options
        native = {
            "class": "torch.nn.parallel.DistributedDataParallel",
            "bucket_cap_mb": self._bucket_cap_mb,
            "gradient_as_bucket_view": o.gradient_as_bucket_view,
            "static_graph": o.static_graph,
            "broadcast_buffers": o.broadcast_buffers,
            "find_unused_parameters": o.find_unused_parameters,
            "comm_hook": o.comm_hook,
            "activation_checkpointing": describe_ac(o.activation_checkpointing),
            "backend": self.ctx.backend,
            "grad_scaler": self.precision.scaler is not None,
            "compile": self.compiled, "float8": self.float8,
        }
        if o.comm_hook == "powersgd":
            native.update(powersgd_rank=o.powersgd_rank, powersgd_start_iter=o.powersgd_start_iter)
        if o.comm_hook == "post_local_sgd":
            native.update(hook="torch post_localSGD_hook + PostLocalSGDOptimizer(PeriodicModelAverager)",
                          period=o.local_sgd_period, warmup_steps=o.local_sgd_warmup_steps,
                          gradient_allreduce_group_size=o.local_sgd_group_size)
        if self._forced_single_bucket:
            native["forced_single_bucket"] = self._forced_single_bucket
        if self.model is not None:   # after the loop: the buckets DDP rebuilt after its first step, in use since
            native.update(bucket_record(self._bucket_bytes(), self._bucket_bytes("rebuilt_bucket_sizes"),
                                        bool(self.model._get_ddp_logging_data().get("has_rebuilt_buckets"))))
        return {"version": torch.__version__, "native_config": native}


def bucket_record(construction: list[int], rebuilt: list[int], has_rebuilt: bool) -> dict:
    """DDP's gradient buckets as the run used them: DDP rebuilds its buckets in gradient-ready
    order after the first step (construction-time bucketing put gpt2_small in one bucket on the
    H100 where 13 all-reduces a step were counted); `bucket_sizes_bytes` is the rebuilt list where
    DDP rebuilt, the construction one beside it."""
    return {"bucket_sizes_bytes": rebuilt if has_rebuilt and rebuilt else construction,
            "bucket_sizes_bytes_at_construction": construction, "buckets_rebuilt": has_rebuilt}
