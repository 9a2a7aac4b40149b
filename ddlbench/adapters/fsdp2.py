"""PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`).

Recommended use (torch FSDP2 docs, torchtitan): shard every transformer block / ResNet stage,
then the root; mixed precision through MixedPrecisionPolicy (bf16 params, fp32 gradient
reduction) rather than autocast; `reshard_after_forward=False` is ZeRO-2-like ("shard grad op");
hybrid sharding uses a 2-D (replicate, shard) DeviceMesh.
"""
from __future__ import annotations

import contextlib
from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from ddlbench.adapters.base import Adapter, StepOut
from ddlbench.adapters.common import batch_norms, forward_backward, fsdp2_no_sync, taxonomy_labels
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, split
from ddlbench.errors import ConfigError
from ddlbench.metrics.comm import AnalyticComm
from ddlbench.metrics.memory import model_state_bytes_per_rank, optimizer_state_bytes_per_param
from ddlbench.models.spec import checkpoint_blocks
from ddlbench.topology import hosts_of, node_groups


class FSDP2Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    reshard_after_forward: bool = True          # False = shard-grad-op (ZeRO-2-like)
    hybrid: bool = False                        # HSDP: shard within groups, replicate across
    hybrid_shard_size: Optional[PositiveInt] = None  # ranks per shard group; null = ranks per node
    cpu_offload: bool = False                   # CPUOffloadPolicy: params/grads/optimizer on host
    reduce_dtype: Literal["fp32", "param"] = "fp32"  # gradient reduction dtype under bf16
    wrap: Literal["blocks", "root"] = "blocks"  # per-block (recommended) or one unit
    activation_checkpointing: bool = False      # recompute each block's forward in backward


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class FSDP2Adapter(Adapter):
    name = "fsdp2"
    Options = FSDP2Options

    @classmethod
    def taxonomy(cls, options) -> dict:
        shard = ("parameters + gradients + optimizer state" if options.reshard_after_forward
                 else "gradients + optimizer state (parameters kept after forward)")
        if options.hybrid:
            shard += ", within shard groups (replicated across)"
        if options.cpu_offload:
            shard += ", offloaded to CPU"
        return taxonomy_labels("data (sharded)", "sync", "all-gather + reduce-scatter", shard)

    @classmethod
    def cost_model(cls, options, dims, model, precision, per_node=None):
        """fully_shard per block (wrap=blocks) or once (root), measured here at grad_accum 1 and 2
        (tests/test_cost_model.py): parameters all-gathered per unit in forward and, resharded after
        forward, again in backward, on every micro-batch, in MixedPrecisionPolicy's param_dtype;
        gradients reduce-scattered once per step (set_requires_gradient_sync(False) on the others)
        in reduce_dtype. Hybrid: the shard group is hybrid_shard_size (or the node's) ranks, and
        every shard's gradient is then all-reduced across the groups. fp32 shards (offloaded to the
        host with cpu_offload); gathered: two units and their gradients (prefetch) or, at the end of
        backward, the root unit (embeddings and head: the largest unit of a real-vocabulary GPT-2)
        with its gradients; with reshard_after_forward=false, every unit from forward to backward."""
        o, dp, p = options, dims.dp, model.params
        shard = (o.hybrid_shard_size or per_node or dp) if o.hybrid else dp
        shard = min(shard, dp)
        gather = DTYPE_BYTES[precision]
        grads = DTYPE_BYTES[cls.grad_reduce_dtype(options, precision)] * p
        units = model.units if o.wrap == "blocks" else 1
        unit = p if o.wrap == "root" else model.largest_block_params
        traffic = (split("all_gather", gather * p, units, shard, per_step=(2 if o.reshard_after_forward else 1)
                         * dims.grad_accum, what="parameters")
                   + split("reduce_scatter", grads, units, shard, what="gradients")
                   + split("all_reduce", grads / shard, units, dp // shard, stride=shard, what="gradient shards"))
        buffers: dict = {}
        if shard > 1:
            if o.reshard_after_forward:    # mid-backward two blocks; at its end the root unit alone
                buffers["gathered units with their gradients (two blocks, or the root unit)"] = max(
                    2 * 2 * gather * unit, 2 * gather * (model.root_params if o.wrap == "blocks" else 0))
            else:
                buffers["every unit gathered from forward to backward"] = gather * p
                buffers["two units' gradients"] = 2 * gather * unit
        return CostModel(
            "torch FSDP2 fully_shard" + (f", hybrid ({shard}-rank shard groups)" if o.hybrid else ""), p,
            shard_ranks=shard, shard_optimizer=True, shard_grads=True, shard_params=True,
            offload_optimizer=o.cpu_offload, offload_params=o.cpu_offload, buffers=buffers, traffic=tuple(traffic),
            backward_grad_bytes=gather)

    @classmethod
    def advise_options(cls, options, devices: int) -> list[dict]:
        """Hybrid: every shard-group size that divides the ranks (neither 1 nor all of them)."""
        if not options.hybrid:
            return [{}]
        return [{"hybrid_shard_size": h} for h in range(2, devices) if devices % h == 0]

    @classmethod
    def check_config(cls, options, cfg, dims) -> None:
        h = options.hybrid_shard_size
        if h is not None and dims.world_size % h:
            raise ConfigError(f"framework.options.hybrid_shard_size {h} does not divide the world "
                              f"size {dims.world_size}")

    @classmethod
    def unsupported_reason(cls, options, cfg, device_type: str) -> Optional[str]:
        if cfg.run.precision == "fp16":
            return ("FSDP2 adapter runs fp32 and bf16 (torch's recommended FSDP2 precision); fp16 "
                    "needs a sharded gradient scaler, which this adapter does not wire")
        return None

    def _mesh(self):
        """1-D over the world, or hybrid: rows are shard groups (the ranks of a node, or
        hybrid_shard_size ranks in host order: ddlbench/topology.py), columns replicate across them."""
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        world = self.ctx.world_size
        if not self.options.hybrid:
            return init_device_mesh(self.ctx.device.type, (world,), mesh_dim_names=("dp_shard",))
        # shard groups, not nodes: the collective counter keeps counting nodes by host
        shard_groups = node_groups(hosts_of(self.ctx), self.options.hybrid_shard_size)
        self.per_node = len(shard_groups[0])
        return DeviceMesh(self.ctx.device.type, torch.tensor(shard_groups), mesh_dim_names=("dp_replicate", "dp_shard"))

    def setup(self, build_model, build_optimizer) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        o = self.options
        model = build_model().to(self.ctx.device)
        self.params = sum(p.numel() for p in model.parameters())
        mp = None
        if self.ctx.precision != "fp32":
            dtype = DTYPES[self.ctx.precision]
            mp = MixedPrecisionPolicy(param_dtype=dtype,
                                      reduce_dtype=torch.float32 if o.reduce_dtype == "fp32" else dtype)
        self.mesh = self._mesh()
        kw = dict(mesh=self.mesh, reshard_after_forward=o.reshard_after_forward)
        if mp is not None:
            kw["mp_policy"] = mp
        if o.cpu_offload:
            # pinned host memory needs a CUDA driver; on CPU-only ranks the path runs unpinned
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")
        if o.activation_checkpointing:   # before sharding, as torchtitan applies it
            checkpoint_blocks(model)
        # BatchNorm in fp32 in units of its own, as FSDP1's MixedPrecision does by default
        # (_module_classes_to_ignore_mixed_precision): with bf16 parameters and its fp32 running
        # statistics cuDNN's batch norm fails in backward (seen on an H100). Inputs stay bf16
        # (cast_forward_inputs=False); cuDNN and CPU batch norm take bf16 input with fp32 weights.
        self.fp32_units = batch_norms(model) if mp is not None else []
        for bn in self.fp32_units:
            fully_shard(bn, **{**kw, "mp_policy": MixedPrecisionPolicy(
                param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)})
        units = model.blocks() if o.wrap == "blocks" else []
        for block in units:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        self.units = len(units) + 1
        self.model = model
        self.optimizer = build_optimizer(model.parameters())
        self._mp = mp

    def _no_sync(self):
        return fsdp2_no_sync(self.model)

    def train_step(self, batch: dict) -> StepOut:
        # precision is FSDP2's MixedPrecisionPolicy, so no autocast on top (ctx is fp32 here)
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self._fp32_ctx(), self._no_sync)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOut(loss=loss)

    def forward_context(self):
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts

    def precision_summary(self) -> str:
        if self._mp is None:
            return "none (fp32)"
        return f"MixedPrecisionPolicy(param_dtype={self._mp.param_dtype}, reduce_dtype={self._mp.reduce_dtype})"

    def _fp32_ctx(self):
        from dataclasses import replace
        return replace(self.ctx, precision="fp32")

    def model_state_bytes_theory(self, params: int, optimizer: str, momentum: float = 0.0) -> int:
        # At rest FSDP2 keeps fp32 sharded parameters, gradients and optimizer states (bf16
        # copies exist only transiently for unsharded units).
        return model_state_bytes_per_rank(
            params, self.per_node or self.ctx.world_size, param_bytes=4, grad_bytes=4,
            optim_bytes=optimizer_state_bytes_per_param(optimizer, momentum),
            shard_optim=True, shard_grads=True, shard_params=True)

    @classmethod
    def grad_reduce_dtype(cls, options, precision: str) -> str:
        """MixedPrecisionPolicy.reduce_dtype: fp32 (torchtitan's recipe) or the parameters' dtype."""
        return "fp32" if precision == "fp32" or options.reduce_dtype == "fp32" else precision

    def analytic_comm(self) -> Optional[AnalyticComm]:
        if self.options.hybrid:
            return None
        # the cost model's payloads: all-gathers on every micro-batch (again in backward when
        # resharded) in MixedPrecisionPolicy's param_dtype, one reduce-scatter in its reduce_dtype
        gathers = 2.0 if self.options.reshard_after_forward else 1.0
        return AnalyticComm(self.cost_payload_psi(),
                            "fully_shard: all-gather per unit in forward"
                            + (" and again in backward (reshard_after_forward)" if gathers == 2 else "")
                            + f" on each of {self.dims.grad_accum} micro-batch(es), in {self.ctx.precision}; "
                            + "reduce-scatter of gradients once per step in "
                            + self.grad_reduce_dtype(self.options, self.ctx.precision),
                            paper_psi=gathers + 1.0, paper="ZeRO paper, stage 3" if gathers == 2 else "ZeRO-2-like")

    def describe(self) -> dict:
        o = self.options
        native = {
            "api": "torch.distributed.fsdp.fully_shard (FSDP2)",
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names),
                     "ranks": self.mesh.mesh.tolist()},
            "reshard_after_forward": o.reshard_after_forward,
            "wrap": o.wrap, "fsdp_units": self.units,
            "fp32_batch_norm_units": len(self.fp32_units),
            "activation_checkpointing": "non-reentrant checkpoint_wrapper per block" if o.activation_checkpointing else None,
            "mp_policy": None if self._mp is None else {
                "param_dtype": str(self._mp.param_dtype), "reduce_dtype": str(self._mp.reduce_dtype)},
            "offload_policy": ({"class": "CPUOffloadPolicy", "pin_memory": self.ctx.device.type == "cuda"}
                               if o.cpu_offload else None),
            "backend": self.ctx.backend,
        }
        return {"version": torch.__version__, "native_config": native}
