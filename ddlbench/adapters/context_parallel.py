"""Context parallelism the PyTorch-native way (torchtitan's layout): ring attention over a `cp` mesh
dimension (torch.distributed.tensor.experimental.context_parallel), composed with FSDP2 over dp_shard
and cp folded together for the parameters.

Each of a replica's `cp` ranks holds 1/cp of every sequence: the input ids, the shifted targets and
the position ids are cut by torch's head-tail load balancer (two chunks a rank, so that the causal
mask's work is even) inside the context; embeddings, norms, MLPs and the head run on the rank's
tokens; SDPA is dispatched to the ring (each rank keeps its queries, the keys and values go round,
the partial outputs are merged by their logsumexp) in forward and backward. On CUDA torch's own ring
handlers run (flash, memory-efficient, cuDNN); on CPU the same ring with the CPU flash kernel
(ddlbench/models/ring_attention_cpu.py). Loss: the rank's summed cross-entropy over (the replica's
target count / cp); FSDP2 averages the gradients over dp_shard x cp, which makes them the replicas'
mean loss's; the reported loss is the cp ranks' mean of theirs (the replica's mean).
"""
from __future__ import annotations

import contextlib

import torch
from pydantic import BaseModel, ConfigDict

from ddlbench.adapters.base import StepOut, Strategy
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, fsdp2_no_sync, split_micro
from ddlbench.adapters.cost import DTYPE_BYTES, StepRules, split
from ddlbench.adapters.parallelize import apply_checkpointing, apply_fully_shard
from ddlbench.adapters.precision import FrameworkCast
from ddlbench.adapters.stage_context import context_errors, shifted_targets
from ddlbench.adapters.variant import Abilities, Variant, taxonomy_labels
from ddlbench.errors import ConfigError
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac
from ddlbench.settings.dims import ParallelSize


class CPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    cp: ParallelSize = 2             # ranks that split each sequence; -1 = world / dp_shard
    dp_shard: ParallelSize = -1      # FSDP2 ranks over which (with cp) the parameters are sharded; -1 = the rest
    activation_checkpointing: Policy = "none"   # none | full | selective_layer:K | selective_op


class ContextParallel(Variant):
    name = "context_parallel"
    Options = CPOptions
    strategy = "ddlbench.adapters.context_parallel:ContextParallelStrategy"

    def abilities(self):      # FSDP2 over dp_shard x cp; ring attention runs SDPA with is_causal, no mask
        return Abilities(settles={"model.attention": "sdpa_causal"},
                         step=StepRules("units", sequence="ring", grads_over_world=True), checkpoints=DCP)

    def taxonomy(self) -> dict:
        return taxonomy_labels("context (ring attention) + data (sharded)", "sync",
                               "ring exchange of keys and values + all-gather + reduce-scatter",
                               "parameters + gradients + optimizer state over dp_shard x cp")

    def parallel_shape(self, cfg) -> dict:
        return {"cp": self.options.cp, "dp_shard": self.options.dp_shard, "dp_replicate": 1}

    def check_config(self, cfg, dims) -> None:
        from ddlbench.models.language import attention_impl
        device = "cuda" if cfg.run.device == "cuda" else "cpu"
        errors = context_errors(cfg.model, dims.cp, attention_impl(getattr(cfg.model, "attention", "auto"), device))
        if errors:
            raise ConfigError("; ".join(errors))

    def unsupported_reason(self, cfg, device_type: str):
        if cfg.run.precision == "fp16":
            return "context parallelism runs fp32 and bf16 (fp16 needs a sharded GradScaler, not wired)"
        return super().unsupported_reason(cfg, device_type)

    def cost_model(self, dims, model, precision, per_node=None):
        """FSDP2 over dp_shard x cp (the parameters' all-gathers in forward and backward per
        micro-batch, one reduce-scatter a step) and the ring as torch 2.14 runs it (measured:
        tests/test_context_parallel.py): per layer and micro-batch, the ranks' keys and values
        all-gathered once in forward and once in backward (its default rotate method, all-gather;
        the payload the whole cp group's k and v, in the activations' dtype), and in backward the
        keys' and values' gradients passed on cp times (all-to-all, fp32: torch accumulates them
        in fp32). Each rank computes and keeps 1/cp of the activations."""
        from ddlbench.adapters.cost import CostModel
        cp, m, shard = dims.cp, dims.grad_accum, dims.dp * dims.cp
        gather = DTYPE_BYTES[precision]
        kv = model.kv_heads / model.attention_heads if model.attention_heads else 1.0
        part = model.boundary_bytes_per_sample * dims.micro_batch / 4 / cp * 2 * kv   # elements of the rank's k and v
        ring = (split("all_gather", part * gather * cp, 1, cp, per_step=2 * model.blocks * m,
                      what="keys and values (forward, and again in backward)", data_parallel=False)
                + split("all_to_all", part * 4.0, 1, cp, per_step=cp * model.blocks * m,
                        what="keys' and values' gradients round the ring (fp32)", data_parallel=False)) if cp > 1 else []
        traffic = (ring
                   + split("all_gather", gather * model.params, model.units, shard, per_step=2 * m, what="parameters")
                   + split("reduce_scatter", 4.0 * model.params, model.units, shard, what="gradients"))
        return CostModel(f"ring attention (cp {cp}) + FSDP2 over dp_shard x cp ({shard})", model.params,
                         shard_ranks=shard, shard_optimizer=True, shard_grads=True, shard_params=True,
                         buffers={"two units gathered (prefetch), with their gradients":
                                  2 * 2 * gather * model.largest_block_params} if shard > 1 else {},
                         activation_share=1 / cp, compute_share=1 / cp, traffic=tuple(traffic))

    def advise_options(self, devices: int) -> list[dict]:
        """Every cp >= 2 that divides the ranks, FSDP2 over the rest (and cp)."""
        return [{"cp": c, "dp_shard": devices // c} for c in range(2, devices + 1) if devices % c == 0]

    def analytic_comm(self, dims, precision, params, per_node=None):
        return None


class ContextParallelStrategy(Strategy):
    def setup(self, build_model, build_optimizer) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from ddlbench.models.spec import count_params

        dims, ctx = self.dims, self.ctx
        shape = dims.mesh_shape()
        self.mesh = init_device_mesh(ctx.device.type, tuple(shape.values()), mesh_dim_names=tuple(shape))
        if ctx.device.type == "cpu":
            from ddlbench.models.ring_attention_cpu import enable
            enable()
        coords = dims.coords(ctx.rank)
        self.cp_rank, self.dp_rank = coords["cp"], dims.dp_rank(ctx.rank)
        self.cp_mesh = self.mesh["cp"]
        model = build_on(build_model, ctx.device)
        self.params = count_params(model)
        if self.options.activation_checkpointing != "none":
            apply_checkpointing(model, self.options.activation_checkpointing)
        fsdp_mesh = self.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")     # torchtitan's: cp folded into the shards
        self.sharded = apply_fully_shard(model, fsdp_mesh, ctx.precision)
        if self.sharded.mp_policy is not None:
            self.precision = FrameworkCast(ctx.device, ctx.precision, self.sharded.precision_summary(" over dp_shard x cp"),
                                           master_weights="fp32 sharded parameters (cast when gathered)")
        self.model = model
        self.optimizer = build_optimizer(model.parameters())

    def train_step(self, batch: dict) -> StepOut:
        import torch.distributed as dist
        from torch.distributed.tensor.experimental import context_parallel

        from ddlbench.models.language import IGNORE
        cp = self.dims.cp
        micro = split_micro(batch, self.dims.grad_accum)
        total = torch.zeros((), device=self.ctx.device)
        for i, mb in enumerate(micro):
            inputs = self.precision.inputs(mb)
            ids = inputs["input_ids"].clone()
            target = shifted_targets(inputs["labels"])       # shifted over the whole sequence
            positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1).contiguous()
            share = (target != IGNORE).sum() / cp
            sync = contextlib.nullcontext() if i == len(micro) - 1 else fsdp2_no_sync(self.model)
            with sync, context_parallel(self.cp_mesh, buffers=[ids, target, positions], buffer_seq_dims=[1, 1, 1],
                                        no_restore_buffers={ids, target, positions}):
                with self.precision.forward_context():
                    loss = self.model(input_ids=ids, position_ids=positions, shift_labels=target,
                                      loss_denominator=share)
                self.precision.backward(loss / len(micro))
            part = loss.detach().float().clone()
            dist.all_reduce(part, group=self.cp_mesh.get_group())
            total += part / cp
        self.precision.step(self.optimizer)
        return StepOut(loss=total / len(micro))

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Every cp rank evaluates whole sequences alike (no ring outside the context); only cp rank
        0 contributes to the evaluator's sum."""
        sums = super().eval_step(batch)
        return sums if self.cp_rank == 0 else torch.zeros_like(sums)

    def describe(self) -> dict:
        return {"version": torch.__version__, "native_config": {
            "api": "torch.distributed.tensor.experimental.context_parallel (ring attention, SDPA) + "
                   "torch.distributed.fsdp.fully_shard over dp_shard x cp",
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names)},
            "cp": self.dims.cp, "load_balancer": "torch's head-tail (2 x cp chunks, causal)",
            "ring_kernel": ("the CPU flash kernel under torch's ring (ddlbench/models/ring_attention_cpu.py)"
                            if self.ctx.device.type == "cpu" else "torch's CUDA ring handlers (flash / efficient / cuDNN)"),
            "loss": "summed cross-entropy of the rank's tokens / (the replica's targets / cp); FSDP2 averages over "
                    "dp_shard x cp",
            "activation_checkpointing": describe_ac(self.options.activation_checkpointing),
            "mp_policy": self.sharded.mp_record(),
            "backend": self.ctx.backend}}
