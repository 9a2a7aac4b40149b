"""FairScale: OSS (sharded optimizer state) with ShardedDataParallel (ZeRO-2-like) or with
plain DDP (ZeRO-1-like), and FairScale's FullyShardedDataParallel (ZeRO-3-like; it needs CUDA
streams: `unsupported` on CPU, so that branch has not run here and not yet on a GPU).

Trap handled here: with torch 2.x's default zero_grad(set_to_none=True), ShardedDDP silently
diverges from DDP after step 2 (its reduce hooks keep references to the .grad tensors), so this
adapter zeroes gradients in place (set_to_none=False) and records it.
"""
from __future__ import annotations

import importlib.util
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from ddlbench.adapters.base import StepOut, Strategy
from ddlbench.adapters.common import build_on, forward_backward
from ddlbench.adapters.cost import CostModel, MiB, autocast_copies, buckets, split
from ddlbench.adapters.optim import param_groups
from ddlbench.adapters.variant import Abilities, Variant, payload_psi, taxonomy_labels
from ddlbench.metrics.comm import AnalyticComm


class FairScaleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    mode: Literal["oss_sdp", "oss_ddp", "fsdp"] = "oss_sdp"
    broadcast_fp16: bool = False        # OSS: broadcast updated params in fp16 (lossy)
    reduce_buffer_size: int = 2**23     # ShardedDDP bucket (elements); fairscale default
    flatten_parameters: bool = True     # FSDP: one flat parameter per unit (fairscale default)


class FairScale(Variant):
    name = "fairscale"
    Options = FairScaleOptions
    strategy = "ddlbench.adapters.fairscale:FairScaleStrategy"

    def abilities(self):
        return Abilities(shards_model_state=True, checkpoints=("sync",))

    def parallel_shape(self, cfg) -> dict:
        """FairScale FSDP shards the parameters over every rank; OSS keeps them whole (dp_replicate)."""
        return {"dp_shard": -1, "dp_replicate": 1} if self.options.mode == "fsdp" else {}

    def taxonomy(self) -> dict:
        options = self.options
        if options.mode == "fsdp":
            return taxonomy_labels("data (sharded)", "sync", "all-gather + reduce-scatter",
                                   "parameters + gradients + optimizer state")
        pattern = "reduce + broadcast" if options.mode == "oss_sdp" else "all-reduce + broadcast"
        shard = "gradients + optimizer state" if options.mode == "oss_sdp" else "optimizer state"
        return taxonomy_labels("data (ZeRO)", "sync", pattern, shard,
                               "fp16 (parameter broadcast)" if options.broadcast_fp16 else "none")

    def cost_model(self, dims, model, precision, per_node=None):
        """Once per step (no_sync on the other micro-batches), over the dp ranks:
        oss_sdp: ShardedDataParallel reduces each gradient bucket (reduce_buffer_size elements) to
        its owner, OSS broadcasts every owner's updated shard (fp16 with broadcast_fp16);
        oss_ddp: DDP's bucketed all-reduce, then the broadcast; fsdp (one unit: the whole model):
        all-gather in forward and again in backward per micro-batch, one reduce-scatter. OSS modes
        zero gradients in place, so every rank keeps all of them, unsharded, between steps."""
        psi, dp, o = 4.0 * model.params, dims.dp, self.options
        bcast = split("broadcast", psi * (0.5 if o.broadcast_fp16 else 1.0), dp, dp, what="parameters")
        # gradients zeroed in place (set_to_none=False): every parameter keeps its .grad between steps
        common = dict(piece=model.params, shard_ranks=dp, buffers=autocast_copies(model.params, precision),
                      grads_preallocated=True)
        if o.mode == "oss_sdp":
            return CostModel("FairScale ShardedDataParallel + OSS", shard_optimizer=True,
                             traffic=tuple(split("reduce", psi, buckets(psi, 4 * o.reduce_buffer_size), dp,
                                                 what="gradients") + bcast), **common)
        if o.mode == "oss_ddp":
            return CostModel("torch DDP + FairScale OSS", shard_optimizer=True,
                             traffic=tuple(split("all_reduce", psi, buckets(psi, 25 * MiB), dp, what="gradients")
                                           + bcast), **common)
        gathered = {"the whole model gathered (params + gradients)": 2 * psi} if dp > 1 else {}
        return CostModel("FairScale FSDP, one flat unit, reshard_after_forward", model.params, shard_ranks=dp,
                         shard_optimizer=True, shard_grads=True, shard_params=True, buffers=gathered,
                         traffic=tuple(split("all_gather", psi, 1, dp, per_step=2 * dims.grad_accum, what="parameters")
                                       + split("reduce_scatter", psi, 1, dp, what="gradients")))

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        options = self.options
        if importlib.util.find_spec("fairscale") is None:
            return "fairscale is not installed (pip install 'ddlbench[fairscale]')"
        if options.mode == "fsdp" and device_type != "cuda":
            return "FairScale FSDP needs CUDA streams; it runs on GPU only"
        if cfg.run.precision != "fp32":
            return "FairScale adapter runs fp32 only (ShardedGradScaler wiring not implemented)"
        return super().unsupported_reason(cfg, device_type)

    def check_config(self, cfg, dims) -> None:
        options = self.options
        if options.mode == "fsdp" and options.flatten_parameters and cfg.optim.exclude_from_decay != "none":
            from ddlbench.errors import ConfigError
            raise ConfigError("FairScale FSDP flattens each unit's parameters into one 1-D tensor, so "
                              "optim.exclude_from_decay cannot tell biases from weights: set "
                              "framework.options.flatten_parameters=false")

    def analytic_comm(self, dims, precision, params, per_node=None) -> Optional[AnalyticComm]:
        payload = payload_psi(self, dims, precision, params, per_node)
        if self.options.mode == "fsdp":   # reshard_after_forward (default): gather in forward and backward
            return AnalyticComm(payload,
                                "FairScale FSDP: all-gather in forward, again in backward, reduce-scatter of gradients",
                                paper_psi=3.0, paper="ZeRO paper, stage 3 (P_os+g+p)")
        if self.options.mode == "oss_ddp":
            return AnalyticComm(payload,
                                "torch DDP all-reduce of gradients, then OSS broadcasts each shard's updated parameters")
        return AnalyticComm(payload,
                            "ShardedDataParallel reduces each gradient to its owner, OSS broadcasts updated parameters",
                            paper_psi=2.0, paper="ZeRO paper, stage 2 (P_os+g)")


class FairScaleStrategy(Strategy):
    def setup(self, build_model, build_optimizer) -> None:
        import fairscale
        from fairscale.optim.oss import OSS

        o = self.options
        model = build_on(build_model, self.ctx.device)
        self.params = sum(p.numel() for p in model.parameters())
        self.version = fairscale.__version__
        if o.mode == "fsdp":
            from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP
            self.model = FSDP(model, flatten_parameters=o.flatten_parameters)
            self.optimizer = build_optimizer(self.model.parameters())
            return
        # OSS calls optim(its groups' shards on this rank, **defaults): the run's optimizer
        # factory takes those groups (made here, so the decay exclusion holds) as they are
        oc = build_optimizer.optim_cfg
        self.optimizer = OSS(params=param_groups(model.parameters(), oc.weight_decay, oc.exclude_from_decay),
                             optim=build_optimizer,
                             broadcast_fp16=o.broadcast_fp16)
        if o.mode == "oss_sdp":
            from fairscale.nn.data_parallel import ShardedDataParallel
            self.model = ShardedDataParallel(model, self.optimizer,
                                             reduce_buffer_size=o.reduce_buffer_size)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP
            kwargs = {"device_ids": [self.ctx.device.index]} if self.ctx.device.type == "cuda" else {}
            self.model = DDP(model, gradient_as_bucket_view=True, **kwargs)

    def checkpoint_saver(self, group):
        """FairScale's way: the sharded state gathered to rank 0 (OSS.consolidate_state_dict; FSDP's full
        state dict and gather_full_optim_state_dict, collectives), rank 0 saves it."""
        from ddlbench.adapters.checkpoint import Rank0Saver
        fsdp = self.options.mode == "fsdp"

        def gather() -> dict:
            model = self.model.state_dict()
            if fsdp:
                return {"model": model, "optimizer": self.model.gather_full_optim_state_dict(self.optimizer)}
            self.optimizer.consolidate_state_dict(recipient_rank=0)
            return {"model": model, "optimizer": self.optimizer.state_dict() if self.ctx.rank == 0 else None}
        how = ("FSDP.state_dict + gather_full_optim_state_dict" if fsdp else "OSS.consolidate_state_dict(recipient_rank=0)")
        def apply(state: dict) -> None:     # OSS partitions a consolidated state dict again on load
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        return Rank0Saver(gather, self.ctx.rank, f"FairScale: {how}, then rank 0's torch.save, fsynced",
                          apply=None if fsdp else apply)

    def train_step(self, batch: dict) -> StepOut:
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self.model.no_sync)
        self.optimizer.step()
        self.model.zero_grad(set_to_none=False)  # in place: see the module docstring
        return StepOut(loss=loss)

    def describe(self) -> dict:
        o = self.options
        if o.mode == "fsdp":
            return {"version": self.version, "native_config": {
                "wrapper": "fairscale.nn.FullyShardedDataParallel (one unit: the whole model)",
                "flatten_parameters": o.flatten_parameters, "reshard_after_forward": True,
                "optimizer": "the run's torch optimizer over the flat shards",
                "zero_grad_set_to_none": False, "backend": self.ctx.backend}}
        native = {
            "optimizer": "fairscale.optim.OSS", "wrapper": {"oss_sdp": "ShardedDataParallel",
                                                              "oss_ddp": "torch DDP"}[o.mode],
            "broadcast_fp16": o.broadcast_fp16, "zero_grad_set_to_none": False,
            "backend": self.ctx.backend,
        }
        if o.mode == "oss_sdp":
            native["reduce_buffer_size"] = o.reduce_buffer_size
        return {"version": self.version, "native_config": native}
