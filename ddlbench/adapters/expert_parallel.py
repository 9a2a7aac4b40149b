"""Expert parallelism, PyTorch-native (torchtitan's layout) for Mixture-of-Experts models: each MoE
layer's experts are split over `ep` ranks and tokens travel to their experts and back by
all-to-all (ddlbench/models/moe.py); the dense part (attention, router, norms, embeddings) is
FSDP2-sharded over all data-parallel ranks and, with tp > 1, tensor-parallel; the experts are
FSDP2-sharded over the data-parallel ranks that hold the same experts (dp_shard / ep). An expert's
gradient sums what every rank of its ep group sent it; FSDP2 averages it over dp_shard / ep ranks,
and the strategy divides it by ep after backward (torchtitan sets FSDP2's gradient divide factor,
a PREMUL_SUM reduction that gloo does not have: one code path for both backends).

One named DeviceMesh ("efsdp", "ep", "tp"), tp innermost then ep (torchtitan borrows the ep
ranks from dp_shard): dp_shard = efsdp x ep, flattened for the dense part. Order (fixed, as
torchtitan): tensor parallel plan -> expert parallel -> activation checkpointing -> compile ->
FSDP2 (experts' units, then blocks, then the root). Without sequence parallelism the tp ranks
route the same tokens: with tp > 1 each experts' shard runs on every tp rank of its ep group
(redundant compute, recorded).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, PositiveInt

from ddlbench.adapters.base import StepOut
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, canonical_parameters, forward_backward, full_tensor, param_row, unwrap
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, StepRules, split
from ddlbench.adapters.parallelize import (
    apply_checkpointing,
    apply_compile,
    apply_expert_parallel,
    apply_fully_shard,
    apply_tensor_parallel,
)
from ddlbench.adapters.precision import FrameworkCast
from ddlbench.adapters.tensor_parallel import TensorParallelStrategy
from ddlbench.adapters.variant import Abilities, Variant, taxonomy_labels
from ddlbench.errors import ConfigError
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac
from ddlbench.settings.dims import ParallelSize, model_fit_errors


class EPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    ep: PositiveInt = 2               # expert-parallel ranks (divides the experts and dp_shard)
    tp: PositiveInt = 1               # tensor-parallel ranks for the dense part
    dp_shard: ParallelSize = -1       # data-parallel (FSDP2) ranks; -1 = world / tp
    activation_checkpointing: Policy = "none"   # none | full | selective_layer:K | selective_op (models/checkpointing.py)


def moe_errors(model_cfg, ep: int, dp_shard: int, over: str = "dp_shard") -> list[str]:
    """Why this MoE model cannot be split over `ep` ranks (empty: it can)."""
    from ddlbench.models.family import of_config
    if of_config(model_cfg).experts is None or getattr(model_cfg, "moe", None) is None:
        return [f"expert parallelism (framework.options.ep) needs a Mixture-of-Experts model (a family with experts and "
                f"model.moe); {model_cfg.name} is dense"]
    errors = []
    if model_cfg.moe.num_experts % ep:
        errors.append(f"framework.options.ep {ep} does not divide model.moe.num_experts {model_cfg.moe.num_experts}")
    if dp_shard % ep:
        errors.append(f"framework.options.ep {ep} does not divide the data-parallel ranks {over} {dp_shard} "
                      "(expert-parallel ranks are data-parallel ranks)")
    return errors


class ExpertParallel(Variant):
    name = "expert_parallel"
    Options = EPOptions
    strategy = "ddlbench.adapters.expert_parallel:ExpertParallelStrategy"

    def abilities(self):
        return Abilities(compiles=True, builds_on_meta=True, shards_model_state=True, step=StepRules("units", experts=True),
                         checkpoints=DCP)

    def taxonomy(self) -> dict:
        tp = self.options.tp > 1
        return taxonomy_labels("expert + data (sharded)" + (" + tensor" if tp else ""), "sync",
                               "all-to-all (tokens) + all-gather + reduce-scatter" + (" + all-reduce" if tp else ""),
                               "experts by ep rank; FSDP2 over data ranks")

    def parallel_shape(self, cfg) -> dict:
        return {"tp": self.options.tp, "dp_shard": self.options.dp_shard, "dp_replicate": 1}

    def cost_model(self, dims, model, precision, per_node=None):
        """Per micro-batch, every MoE layer all-to-alls its tokens to their experts and back in
        forward, and the gradients the same way in backward (4 all-to-alls of micro_batch x seq x
        top_k x hidden in the activations' dtype among the ep ranks, tp ranks apart; uniform
        routing); with tp > 1 the attention's output all-reduced in forward and in backward. FSDP2:
        the dense part all-gathered per block over dp_shard (again in backward), reduce-scattered
        once in fp32; each layer's experts (1/ep of them) the same over the dp_shard / ep ranks that
        hold them (ep x tp ranks apart). Model state: the dense part (its attention split by tp) and
        the experts (1/ep, not split by tp) sharded over dp_shard: both 1/dp_shard. Two blocks
        gathered (prefetch) and one layer's routed tokens sent and received."""
        tp, shard, m, ep = dims.tp, dims.dp_shard, dims.grad_accum, self.options.ep
        efsdp = max(shard // ep, 1)
        mine = model.share(range(len(model.pieces)), tp)
        experts, gather = model.experts_params, DTYPE_BYTES[precision]
        dense = mine.params - experts
        act = model.boundary_bytes_per_sample * dims.micro_batch / 4 * gather
        routed = model.routed_bytes_per_sample * dims.micro_batch
        layer_experts = experts / max(model.moe_layers, 1) / ep
        traffic = (split("all_reduce", act, 1, tp, per_step=sum(model.tp_all_reduces()) * model.blocks * m,
                         what="attention outputs and input gradients (its plan's row- and column-wise layers)",
                         data_parallel=False)
                   + split("all_to_all", routed, 1, ep, stride=tp, per_step=4 * model.moe_layers * m,
                           what="routed tokens", data_parallel=False)
                   + split("all_gather", gather * dense, model.units, shard, stride=tp, per_step=2 * m,
                           what="parameters (dense)")
                   + split("reduce_scatter", 4.0 * dense, model.units, shard, stride=tp, what="gradients (dense)")
                   + split("all_gather", gather * experts / ep, model.moe_layers, efsdp, stride=ep * tp,
                           per_step=2 * m, what="parameters (experts)")
                   + split("reduce_scatter", 4.0 * experts / ep, model.moe_layers, efsdp, stride=ep * tp,
                           what="gradients (experts)"))
        block = model.largest_block_params - experts / max(model.moe_layers, 1) + layer_experts
        buffers = {"all-to-all send and receive buffers (one layer)": 2 * routed}
        if shard > 1:
            buffers["two units gathered (prefetch), with their gradients"] = 2 * 2 * gather * block / tp
        return CostModel(f"expert parallel (ep {ep}) + FSDP2 over {shard}" + (f" + tensor parallel (tp {tp})"
                                                                              if tp > 1 else ""),
                         mine.params, shard_ranks=shard, shard_optimizer=True,
                         shard_grads=True, shard_params=True, buffers=buffers, activation_share=mine.activations,
                         compute_share=mine.compute, traffic=tuple(traffic))

    def advise_options(self, devices: int) -> list[dict]:
        """Every ep that divides the data-parallel ranks, with tp 1 and 2 (the model's check refuses
        an ep that does not divide its experts)."""
        out = []
        for tp in (1, 2):
            if devices % tp:
                continue
            dp = devices // tp
            out += [{"ep": e, "tp": tp, "dp_shard": dp} for e in range(1, dp + 1) if dp % e == 0]
        return out

    def check_config(self, cfg, dims) -> None:
        errors = moe_errors(cfg.model, self.options.ep, dims.dp_shard) + model_fit_errors(dims, cfg.model, 1)
        if errors:
            raise ConfigError("; ".join(errors))

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if cfg.run.precision == "fp16":
            return "expert-parallel adapter runs fp32 and bf16 (FSDP2's; fp16 needs a sharded GradScaler, not wired)"
        return super().unsupported_reason(cfg, device_type)

    def dry_run_info(self, cfg, dims) -> dict:
        from ddlbench.models.moe import dry_run_layout
        return {"expert_parallel": dry_run_layout(cfg.model, self.options.ep, dims)}


class ExpertParallelStrategy(TensorParallelStrategy):
    def setup(self, build_model, build_optimizer) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from ddlbench.models.moe import experts_of
        from ddlbench.models.spec import count_params
        from ddlbench.models.tensor_parallel import plan_description

        dims, ctx, o = self.dims, self.ctx, self.options
        self.ep = o.ep
        efsdp = dims.dp_shard // o.ep
        self.mesh = init_device_mesh(ctx.device.type, (efsdp, o.ep, dims.tp), mesh_dim_names=("efsdp", "ep", "tp"))
        dense_mesh = self.mesh["efsdp", "ep"]._flatten("dp_shard")
        coords = dims.coords(ctx.rank)
        self.tp_rank, self.dp_rank = coords["tp"], dims.dp_rank(ctx.rank)
        model = build_on(build_model, ctx.device)
        self.params = count_params(model)
        self.plan = plan_description(model) if dims.tp > 1 else None
        self.tp_blocks = apply_tensor_parallel(model, self.mesh["tp"]) if dims.tp > 1 else 0
        self.experts_per_rank = apply_expert_parallel(model, self.mesh["ep"]) if o.ep > 1 else None
        self.experts = experts_of(model)
        if o.activation_checkpointing != "none":
            apply_checkpointing(model, o.activation_checkpointing)
        self.compiled = apply_compile(model) if ctx.compile else None
        self.sharded = None
        if dims.dp_shard > 1:
            self.sharded = apply_fully_shard(model, dense_mesh, ctx.precision, experts=tuple(experts_of(model)),
                                             experts_mesh=self.mesh["efsdp"])
            if self.sharded.mp_policy is not None:   # FSDP2 casts: no autocast on top
                self.precision = FrameworkCast(ctx.device, ctx.precision,
                                               self.sharded.precision_summary(" over dp_shard"),
                                               master_weights="fp32 sharded parameters (cast when gathered)")
        self.model = model
        self.optimizer = build_optimizer(model.parameters())

    def train_step(self, batch: dict) -> StepOut:
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self._no_sync)
        if self.ep > 1:   # the experts' gradients: the mean over all data-parallel ranks (see above)
            with torch.no_grad():
                for experts in self.experts:
                    for p in experts.parameters():
                        if p.grad is not None:
                            p.grad.div_(self.ep)
        self.precision.step(self.optimizer)
        return StepOut(loss=loss)

    def param_stats(self) -> list[tuple[int, list[float]]]:
        """Every full parameter as one rank would hold it: the experts gathered over the ep ranks
        (collective) and concatenated in expert order."""
        out, experts = [], {id(p) for e in self.experts for p in e.parameters()}   # after fully_shard's
        for p, canon in canonical_parameters(unwrap(self.model)):
            t = full_tensor(p)
            if id(p) in experts and self.ep > 1:
                parts = [torch.empty_like(t) for _ in range(self.ep)]
                dist.all_gather(parts, t.contiguous(), group=self.mesh["ep"].get_group())
                t = torch.cat(parts)
            out.append((p.ndim, param_row(canon(t))))
        return out

    def moe_record(self) -> dict:
        return {"ep": self.ep, "experts_per_rank": self.experts_per_rank or "all",
                "dispatch": ("all_to_all_single (torch.distributed.nn.functional: differentiable), token counts "
                             "exchanged first (one host read per MoE layer per forward)" if self.ep > 1 else None),
                "experts_fsdp_ranks": self.dims.dp_shard // self.ep,
                "experts_on_tp_ranks": "replicated (each tp rank routes the same tokens)" if self.dims.tp > 1 else None}

    def describe(self) -> dict:
        native = {
            "api": "expert parallelism by all_to_all_single (torchtitan's layout) + "
                   "torch.distributed.fsdp.fully_shard" + (" + DTensor tensor parallel" if self.dims.tp > 1 else ""),
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names)},
            "ep": self.ep, "experts_per_rank": self.experts_per_rank,
            "plan": self.plan, "tp_blocks": self.tp_blocks,
            "order": "tensor parallel -> expert parallel -> activation checkpointing -> compile -> FSDP2 "
                     "(experts' units over efsdp, blocks and root over dp_shard)",
            "fsdp_units": None if self.sharded is None else self.sharded.units,
            "experts_gradient": (f"FSDP2 mean over {self.dims.dp_shard // self.ep} efsdp rank(s), then divided by "
                                 f"ep {self.ep} after backward" if self.ep > 1 else None),
            "activation_checkpointing": describe_ac(self.options.activation_checkpointing), "compile": self.compiled,
            "mp_policy": None if self.sharded is None else self.sharded.mp_record(),
            "backend": self.ctx.backend,
        }
        return {"version": torch.__version__, "native_config": native}
