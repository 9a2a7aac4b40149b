"""PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`).

Recommended use (torch FSDP2 docs, torchtitan): shard every transformer block / ResNet stage,
then the root; mixed precision through MixedPrecisionPolicy (bf16 params, fp32 gradient
reduction) rather than autocast; `reshard_after_forward=False` is ZeRO-2-like ("shard grad op");
hybrid sharding uses a 2-D (replicate, shard) DeviceMesh.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from ddlbench.adapters.base import StepOut, Strategy
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, forward_backward, fsdp2_no_sync
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, StepRules, split
from ddlbench.adapters.parallelize import apply_checkpointing, apply_compile, apply_float8, apply_fully_shard
from ddlbench.adapters.precision import FrameworkCast
from ddlbench.adapters.variant import Abilities, Variant, payload_psi, taxonomy_labels
from ddlbench.comm.topology import hosts_of, node_groups
from ddlbench.errors import ConfigError
from ddlbench.metrics.comm import AnalyticComm
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac


class FSDP2Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    reshard_after_forward: bool = True          # False = shard-grad-op (ZeRO-2-like)
    hybrid: bool = False                        # HSDP: shard within groups, replicate across
    hybrid_shard_size: Optional[PositiveInt] = None  # ranks per shard group; null = ranks per node
    cpu_offload: bool = False                   # CPUOffloadPolicy: params/grads/optimizer on host
    reduce_dtype: Literal["fp32", "param"] = "fp32"  # gradient reduction dtype under bf16
    wrap: Literal["blocks", "root"] = "blocks"  # per-block (recommended) or one unit
    activation_checkpointing: Policy = "none"   # none | full | selective_layer:K | selective_op (models/checkpointing.py)
    # at bf16, BatchNorms stay fp32 (cuDNN): all in one fully_shard unit, or one unit per layer (FSDP1's way)
    batch_norm_units: Literal["one", "per_layer"] = "one"


class FSDP2(Variant):
    name = "fsdp2"
    Options = FSDP2Options
    strategy = "ddlbench.adapters.fsdp2:FSDP2Strategy"

    def abilities(self):
        return Abilities(compiles=True, float8=True, builds_on_meta=True, shards_model_state=True, step=StepRules("units"),
                         checkpoints=DCP)

    def taxonomy(self) -> dict:
        options = self.options
        shard = ("parameters + gradients + optimizer state" if options.reshard_after_forward
                 else "gradients + optimizer state (parameters kept after forward)")
        if options.hybrid:
            shard += ", within shard groups (replicated across)"
        if options.cpu_offload:
            shard += ", offloaded to CPU"
        return taxonomy_labels("data (sharded)", "sync", "all-gather + reduce-scatter", shard)

    def cost_model(self, dims, model, precision, per_node=None):
        """fully_shard per block (wrap=blocks) or once (root), measured here at grad_accum 1 and 2
        (tests/test_cost_model.py): parameters all-gathered per unit in forward and, resharded after
        forward, again in backward, on every micro-batch, in MixedPrecisionPolicy's param_dtype;
        gradients reduce-scattered once per step (set_requires_gradient_sync(False) on the others)
        in reduce_dtype. Hybrid: the shard group is hybrid_shard_size (or the node's) ranks, and
        every shard's gradient is then all-reduced across the groups. fp32 shards (offloaded to the
        host with cpu_offload); gathered: two units and their gradients (prefetch) or, at the end of
        backward, the root unit (embeddings and head: the largest unit of a real-vocabulary GPT-2)
        with its gradients; with reshard_after_forward=false, every unit from forward to backward."""
        o, dp, p = self.options, dims.dp, model.params
        shard = (o.hybrid_shard_size or per_node or dp) if o.hybrid else dp
        shard = min(shard, dp)
        gather = DTYPE_BYTES[precision]
        grads = DTYPE_BYTES[self.grad_reduce_dtype(precision)] * p
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

    def advise_options(self, devices: int) -> list[dict]:
        """Hybrid: every shard-group size that divides the ranks (neither 1 nor all of them)."""
        if not self.options.hybrid:
            return [{}]
        return [{"hybrid_shard_size": h} for h in range(2, devices) if devices % h == 0]

    def parallel_shape(self, cfg) -> dict:
        """The layout that runs: every rank one shard of the model (dp_shard = the world), or hybrid:
        shard groups of hybrid_shard_size ranks (else a node's), replicated across them."""
        if not self.options.hybrid:
            return {"dp_shard": -1, "dp_replicate": 1}
        world, nodes = cfg.launcher.nproc, max(1, cfg.launcher.nodes)
        size = self.options.hybrid_shard_size or max(1, world // nodes)
        return {"dp_shard": size, "dp_replicate": -1} if world % size == 0 else {}

    def check_config(self, cfg, dims) -> None:
        h = self.options.hybrid_shard_size
        if h is not None and dims.world_size % h:
            raise ConfigError(f"framework.options.hybrid_shard_size {h} does not divide the world "
                              f"size {dims.world_size}")

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if cfg.run.precision == "fp16":
            return ("FSDP2 adapter runs fp32 and bf16 (torch's recommended FSDP2 precision); fp16 "
                    "needs a sharded gradient scaler, which this adapter does not wire")
        return super().unsupported_reason(cfg, device_type)

    def grad_reduce_dtype(self, precision: str) -> str:
        """MixedPrecisionPolicy.reduce_dtype: fp32 (torchtitan's recipe) or the parameters' dtype."""
        return "fp32" if precision == "fp32" or self.options.reduce_dtype == "fp32" else precision

    def analytic_comm(self, dims, precision, params, per_node=None) -> Optional[AnalyticComm]:
        if self.options.hybrid:
            return None
        # the cost model's payloads: all-gathers on every micro-batch (again in backward when
        # resharded) in MixedPrecisionPolicy's param_dtype, one reduce-scatter in its reduce_dtype
        gathers = 2.0 if self.options.reshard_after_forward else 1.0
        return AnalyticComm(payload_psi(self, dims, precision, params, per_node),
                            "fully_shard: all-gather per unit in forward"
                            + (" and again in backward (reshard_after_forward)" if gathers == 2 else "")
                            + f" on each of {dims.grad_accum} micro-batch(es), in {precision}; "
                            + "reduce-scatter of gradients once per step in " + self.grad_reduce_dtype(precision),
                            paper_psi=gathers + 1.0, paper="ZeRO paper, stage 3" if gathers == 2 else "ZeRO-2-like")


class FSDP2Strategy(Strategy):
    def _mesh(self):
        """1-D over the world, or hybrid: rows are shard groups (the ranks of a node, or
        hybrid_shard_size ranks in host order: ddlbench/comm/topology.py), columns replicate across them."""
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        world = self.ctx.world_size
        if not self.options.hybrid:
            return init_device_mesh(self.ctx.device.type, (world,), mesh_dim_names=("dp_shard",))
        # shard groups, not nodes: the collective counter keeps counting nodes by host
        shard_groups = node_groups(hosts_of(self.ctx), self.options.hybrid_shard_size)
        self.per_node = len(shard_groups[0])
        return DeviceMesh(self.ctx.device.type, torch.tensor(shard_groups), mesh_dim_names=("dp_replicate", "dp_shard"))

    def setup(self, build_model, build_optimizer) -> None:
        o = self.options
        model = build_on(build_model, self.ctx.device)
        self.float8 = apply_float8(model) if self.ctx.float8 else None   # before compile and fully_shard
        self.params = sum(p.numel() for p in model.parameters())
        self.mesh = self._mesh()
        if o.activation_checkpointing != "none":   # before sharding, as torchtitan applies it
            apply_checkpointing(model, o.activation_checkpointing)
        self.compiled = apply_compile(model) if self.ctx.compile else None
        self.sharded = apply_fully_shard(model, self.mesh, self.ctx.precision, reduce_dtype=o.reduce_dtype,
                                         reshard_after_forward=o.reshard_after_forward, wrap=o.wrap,
                                         cpu_offload=o.cpu_offload, batch_norm_units=o.batch_norm_units)
        if self.sharded.mp_policy is not None:   # FSDP2 casts: no autocast on top
            self.precision = FrameworkCast(self.ctx.device, self.ctx.precision, self.sharded.precision_summary(),
                                           master_weights="fp32 sharded parameters (cast when gathered)")
        self.model = model
        self.optimizer = build_optimizer(model.parameters())

    def _no_sync(self):
        return fsdp2_no_sync(self.model)

    def train_step(self, batch: dict) -> StepOut:
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self._no_sync)
        self.precision.step(self.optimizer)
        return StepOut(loss=loss)

    def describe(self) -> dict:
        o = self.options
        native = {
            "api": "torch.distributed.fsdp.fully_shard (FSDP2)",
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names),
                     "ranks": self.mesh.mesh.tolist()},
            "reshard_after_forward": o.reshard_after_forward,
            "wrap": o.wrap, "fsdp_units": self.sharded.units,
            "fp32_batch_norm_units": self.sharded.fp32_units,
            "fp32_batch_norm_layers": self.sharded.fp32_layers,
            "params_made_contiguous": self.sharded.made_contiguous,
            "activation_checkpointing": describe_ac(o.activation_checkpointing),
            "mp_policy": self.sharded.mp_record(),
            "compile": self.compiled, "float8": self.float8,
            "offload_policy": ({"class": "CPUOffloadPolicy", "pin_memory": self.ctx.device.type == "cuda"}
                               if o.cpu_offload else None),
            "backend": self.ctx.backend,
        }
        return {"version": torch.__version__, "native_config": native}
