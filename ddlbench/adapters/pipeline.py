"""Pipeline parallelism with `torch.distributed.pipelining` (GPipe, 1F1B, interleaved 1F1B,
zero-bubble), optionally x data parallel (dp replicas, and FSDP2 inside every stage: dp_shard) and
x tensor parallel (tp) on one DeviceMesh: torchtitan's 3-D layout (FSDP x TP x PP), with sequence and loss
parallelism in the stages; x expert parallel (ep) over the replicas for MoE models; x context parallel (cp:
ring attention, torchtitan's 4-D layout, ddlbench/adapters/stage_context.py). What a rank does to its
stages beyond the schedule (tied copies, FSDP2 per stage, experts): ddlbench/adapters/stages.py.

How a model becomes stages: every rank builds the whole model with the run's seed (the same
initial weights as a single process), cuts it into pieces (ddlbench/models/pipeline.py), keeps the
contiguous pieces of its own stages and drops the rest. Stage placement follows the schedule:
one stage per rank (gpipe, 1f1b), `stages_per_rank` stages in a loop (interleaved_1f1b,
interleaved_zero_bubble: stage s on rank s mod pp) or in a V (zbv_zero_bubble: rank r holds
stages r and 2pp-1-r). Per stage: TP plan -> checkpointing -> FSDP2 -> stage wrapper.

Tied weights (GPT-2 lm_head = wte): a rank holding both ends keeps one Parameter; when the
embedding and the head sit on different ranks each keeps a copy, and after every backward
their gradients are summed over the two ranks (one all-reduce on a 2-rank group), so both
copies take the same optimizer step and stay equal - what Megatron-LM does with its
embedding group. Data parallelism: gradients averaged over the dp group after the schedule
(one flattened all-reduce per rank, no overlap with backward); with dp_shard > 1, FSDP2 in every
stage as torchtitan applies it to each model part (stages.shard_stages), gradients reduce-scattered
at the last micro-batch's backward (torch.distributed.pipelining drives FSDP's gradient sync).

Loss: per micro-batch on the last stage (mean over micro-batches; the schedule scales
gradients by 1/n_microbatches, so the update equals the full local batch's mean loss). With
`n_microbatches` below the step's micro-batches the schedule runs several times a step (gradient
accumulation over a pipeline) and the accumulated gradients are divided by all of them once.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Literal, Optional

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, PositiveInt
from torch import nn

from ddlbench.adapters.base import ModelParallel, StepOut, Strategy
from ddlbench.adapters.common import canonical_parameters, local_tensor, param_row, recv_any, send_any
from ddlbench.adapters.cost import StepRules
from ddlbench.adapters.tensor_parallel import (
    loss_parallel,
    sum_partial_grads,
)
from ddlbench.adapters.variant import Abilities, Variant, taxonomy_labels
from ddlbench.metrics.memory import optimizer_state_bytes_per_param
from ddlbench.metrics.pipeline import analytic_bubble, pipeline_summary
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac
from ddlbench.settings.dims import ParallelSize

SCHEDULES = {
    "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "interleaved_zero_bubble": "ScheduleInterleavedZeroBubble", "zbv_zero_bubble": "ScheduleZBVZeroBubble",
}
MULTI = ("interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble")


class PipelineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble"] = "1f1b"
    pp: ParallelSize = -1                # pipeline ranks; -1 = world / (dp * dp_shard * tp)
    dp: ParallelSize = 1                 # data-parallel replicas of the pipeline (-1: what the world leaves)
    dp_shard: ParallelSize = 1           # FSDP2 inside every stage over this many ranks (-1: what the world leaves)
    tp: PositiveInt = 1                        # tensor parallel inside every stage (3-D)
    sequence_parallel: bool = False            # Megatron's SP in the stages: 1/tp of the sequence between them
    loss_parallel: bool = False                # the LM head over the vocabulary, the loss on its shards
    ep: PositiveInt = 1                        # expert parallel in the stages, over dp (or dp_shard): 1/ep of the experts
    cp: PositiveInt = 1                        # context parallel in the stages: ring attention, 1/cp of every sequence
    stages_per_rank: PositiveInt = 1           # > 1 only for the multi-stage schedules
    n_microbatches: Optional[PositiveInt] = None  # null = pp (or run.micro_batch decides)
    activation_checkpointing: Policy = "none"  # none | full | selective_layer:K | selective_op, per block of each stage


class Pipeline(Variant):
    name = "pipeline"
    Options = PipelineOptions
    strategy = "ddlbench.adapters.pipeline:PipelineStrategy"

    def abilities(self):
        o = self.options
        step = StepRules("stages", sequence="ring", tp_sequence_parallel=o.sequence_parallel, vocab_parallel=o.loss_parallel,
                         embedding_parallel=o.sequence_parallel, experts=o.ep > 1)
        # ring attention (cp) runs SDPA with is_causal and no mask
        return Abilities(settles={"model.attention": "sdpa_causal"} if o.cp > 1 else {}, step=step,
                         checkpoints=("sync", "async"), fake_group="a pipeline schedule exchanges activations with "
                         "the other stages' ranks point to point: rank 0 alone waits on receives no fake peer sends")

    def taxonomy(self) -> dict:
        o = self.options
        sharded = o.dp_shard != 1 or o.cp > 1        # context parallelism: FSDP2 over dp_shard x cp
        kinds = (["pipeline"] + (["tensor"] if o.tp > 1 else []) + (["context"] if o.cp > 1 else [])
                 + (["data"] if o.dp != 1 else []) + (["sharded data"] if sharded else [])
                 + (["expert"] if o.ep > 1 else []))
        comm = ("p2p" + (" + all-gather + reduce-scatter" if sharded else "")
                + (" + all-reduce" if o.tp > 1 or o.dp != 1 else "") + (" + all-to-all" if o.ep > 1 else "")
                + (" + ring exchange of keys and values" if o.cp > 1 else ""))
        return taxonomy_labels(" + ".join(kinds), "sync", comm,
                               "layers across stages" + (", sharded inside each" if sharded else ""))

    def parallel_shape(self, cfg) -> dict:
        options = self.options
        m = options.n_microbatches
        if m is None and cfg.run.micro_batch is None:
            pp = options.pp if options.pp != -1 else max(1, cfg.launcher.nproc // max(1, options.dp * options.dp_shard
                                                                                       * options.tp))
            m = pp
        return {"tp": options.tp, "pp": options.pp, "dp_replicate": options.dp, "dp_shard": options.dp_shard,
                "n_microbatches": m, "cp": options.cp}

    def stages_per_rank(self) -> int:
        return 2 if self.options.schedule == "zbv_zero_bubble" else self.options.stages_per_rank

    def check_config(self, cfg, dims) -> None:
        from ddlbench.adapters.pipeline_checks import check_pipeline
        check_pipeline(self.options, cfg, dims, self.stages_per_rank())

    def cost_model(self, dims, model, precision, per_node=None):
        from ddlbench.adapters.stages import pipeline_cost
        return pipeline_cost(self.options, self.stages_per_rank(), dims, model, precision)

    def advise_options(self, devices: int) -> list[dict]:
        """Every pipeline depth > 1 that divides the ranks, the rest replicas (or, with dp_shard, FSDP2)."""
        if self.options.dp_shard != 1:
            return [{"pp": p, "dp": 1, "dp_shard": devices // p} for p in range(2, devices) if devices % p == 0]
        return [{"pp": p, "dp": devices // p} for p in range(2, devices + 1) if devices % p == 0]

    def dry_run_info(self, cfg, dims) -> dict:
        """Stage layout and parameters per stage, from the model built on the meta device."""
        from ddlbench.adapters.stages import schedule_microbatches
        from ddlbench.models.pipeline import stage_layout
        options, v = self.options, self.stages_per_rank()
        n_pieces, stages = stage_layout(cfg.model, options.schedule, dims.pp, v)
        m, repeats = schedule_microbatches(options, dims)
        return {"pipeline": {"schedule": options.schedule, "n_microbatches": m, "schedule_repeats": repeats,
                             "micro_batch": dims.micro_batch, "pieces": n_pieces, "stages": stages,
                             "bubble_fraction_analytic": analytic_bubble(options.schedule, dims.pp, m, v)}}

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if cfg.run.precision == "fp16":
            return "pipeline adapter runs fp32 and bf16 (fp16 needs a GradScaler across stages, not wired)"
        return super().unsupported_reason(cfg, device_type)


class PipelineStrategy(ModelParallel, Strategy):
    # ---- setup ----
    def setup(self, build_model, build_optimizer) -> None:
        import torch.distributed.pipelining as pipelining
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage

        from ddlbench.models.checkpointing import apply_to_stages
        from ddlbench.models.pipeline import Stage, loss_function, partition, pieces, stage_owners, tied_parameters
        from ddlbench.models.spec import count_params

        o, dims, ctx = self.options, self.dims, self.ctx
        v = self.variant.stages_per_rank()
        shape = dims.mesh_shape()
        self.mesh = init_device_mesh(ctx.device.type, tuple(shape.values()), mesh_dim_names=tuple(shape))
        coords = dims.coords(ctx.rank)
        self.pp_rank, self.tp_rank, self.dp_rank = coords["pp"], coords["tp"], dims.dp_rank(ctx.rank)
        self.cp_rank = coords.get("cp", 0)
        self.pp_group = self.mesh["pp"].get_group()
        self.pp_ranks = dist.get_process_group_ranks(self.pp_group)
        self.cp_mesh = self.mesh["cp"] if dims.cp > 1 else None
        if self.cp_mesh is not None and ctx.device.type == "cpu":
            from ddlbench.models.ring_attention_cpu import enable
            enable()
        # the flattened all-reduce after the schedule: plain replicas only (FSDP2, over dp_shard x cp, syncs its own)
        self.dp_group = self.mesh["dp_replicate"].get_group() if dims.dp > 1 and dims.dp_shard * dims.cp == 1 else None

        full = build_model()
        self.params = count_params(full)
        self.loss = loss_function(full)
        piece_list = pieces(full)
        n_stages = dims.pp * v
        self.ranges = partition(len(piece_list), n_stages)
        self.owners = stage_owners(o.schedule, dims.pp, v)
        self.local_ids = [s for s in range(n_stages) if self.owners[s] == self.pp_rank]
        self.stage_modules = [Stage(*(piece_list[i] for i in self.ranges[s])).to(ctx.device)
                              for s in self.local_ids]
        if dims.tp > 1:     # under SP an untied embedding row-wise over the vocabulary (torchtitan's plan)
            from ddlbench.adapters.parallelize import apply_tensor_parallel
            untied = not tied_parameters(piece_list)
            for module in self.stage_modules:
                apply_tensor_parallel(module, self.mesh["tp"], o.sequence_parallel, o.loss_parallel, untied)
        from ddlbench.adapters.stages import parameter_ids, shard_stage_experts
        self.ep_mesh, self.experts = shard_stage_experts(self.stage_modules, getattr(full, "family", None), dims, o.ep,
                                                         ctx.device.type)
        # after tensor parallelism (torchtitan's order); blocks numbered over the whole model
        from ddlbench.adapters.stage_context import decoder_blocks
        n_blocks = sum(1 for s in self.local_ids for i in self.ranges[s] if 0 < i < len(piece_list) - 1)
        self.blocks = decoder_blocks(self.stage_modules, n_blocks) if self.cp_mesh is not None else []
        self.checkpointed = apply_to_stages(self.stage_modules, [self.ranges[s] for s in self.local_ids],
                                            len(piece_list), o.activation_checkpointing)
        self._copies: set[int] = set()   # ids of the extra copies of tied parameters (_untie)
        self._tied = self._untie(tied_parameters(piece_list))
        self.sharded = self._shard(len(piece_list)) if dims.dp_shard * dims.cp > 1 else None
        self.expert_ids = parameter_ids(self.experts)     # after FSDP2, which gives the experts new Parameters
        self.model = nn.ModuleDict({f"stage{s}": m for m, s in zip(self.stage_modules, self.local_ids)})  # keys unique over ranks
        local = {id(p): p for m in self.stage_modules for p in m.parameters()}
        self.local_params = list(local.values())
        # fingerprint order = the model's parameter order: stages in order, each in its own order
        self._ordered = [((s, j), p, canon) for m, s in zip(self.stage_modules, self.local_ids)
                         for j, (p, canon) in enumerate(canonical_parameters(m))
                         if id(p) not in self._copies]
        self.local_param_count = sum(local_tensor(p).numel() for p in self.local_params)
        # static stage metadata with experts: no inference pass (its all-to-alls would depend on its data)
        from ddlbench.adapters.stages import static_boundaries
        examples = static_boundaries(piece_list, full, self.local_ids, n_stages, dims.micro_batch, self.precision,
                                     ctx.device, self.sharded) if self.expert_ids else {}
        del full, piece_list

        stages = [PipelineStage(m, s, n_stages, ctx.device, group=self.pp_group, **examples.get(s, {}))
                  for m, s in zip(self.stage_modules, self.local_ids)]
        cls = getattr(pipelining, SCHEDULES[o.schedule])
        from ddlbench.adapters.stages import schedule_microbatches
        self.n_microbatches, self.repeats = schedule_microbatches(o, dims)
        # stepped several times a step its scale_grads would divide the earlier schedules' gradients again
        self.schedule = cls(stages if o.schedule in MULTI else stages[0], n_microbatches=self.n_microbatches,
                            loss_fn=self._loss_fn, scale_grads=self.repeats == 1)
        self.first, self.last = 0 in self.local_ids, n_stages - 1 in self.local_ids
        self.optimizer = build_optimizer(self.local_params)
        self._inputs: dict[int, torch.Tensor] = {}
        for module, s in zip(self.stage_modules, self.local_ids):
            module.register_forward_pre_hook(self._keep_input(s))

    def _loss_fn(self, output, target):
        from torch.distributed.tensor import DTensor
        if self.cp_mesh is not None:
            from ddlbench.adapters.stage_context import part_loss
            return part_loss(output, target, self.cp_mesh.get_group())
        loss = self.loss(output, target)     # loss parallel: a replicated DTensor, its backward through to_local
        return loss.to_local() if isinstance(loss, DTensor) else loss

    def _keep_input(self, stage_id: int):
        def hook(_module, args):
            if self.model.training:
                self._inputs[stage_id] = args[0].detach()
        return hook

    def _shard(self, n_pieces: int):
        """FSDP2 on every local stage (adapters/stages.py); the tied copies found again."""
        from ddlbench.adapters.precision import FrameworkCast
        from ddlbench.adapters.stages import shard_stages
        dims, ctx = self.dims, self.ctx
        shard = "dp_shard"
        if dims.cp > 1:      # torchtitan's fold: the parameters sharded over dp_shard x cp (cp ranks always shard)
            self.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
            shard = "dp_shard_cp"
        mesh = self.mesh[shard] if dims.dp_replicate == 1 else self.mesh["dp_replicate", shard]
        blocks = [[m[j] for j, i in enumerate(self.ranges[s]) if 0 < i < n_pieces - 1]
                  for m, s in zip(self.stage_modules, self.local_ids)]
        sharded, self._tied, self._copies = shard_stages(self.stage_modules, blocks, mesh, ctx.precision, self._tied,
                                                         self._copies, self.experts,
                                                         self.ep_mesh["edp"] if self.ep_mesh is not None else None)
        if sharded.mp_policy is not None:    # FSDP2 casts: no autocast on top
            self.precision = FrameworkCast(ctx.device, ctx.precision, sharded.precision_summary(" over dp_shard"),
                                           master_weights="fp32 sharded parameters (cast when gathered)")
        return sharded

    def _untie(self, tied) -> list[tuple[list[nn.Parameter], Optional[dist.ProcessGroup]]]:
        from ddlbench.adapters.stages import untie_across_ranks
        untied, self._copies = untie_across_ranks(tied, self.ranges, self.owners, self.local_ids, self.stage_modules,
                                                  self.dims, self.ctx.rank)
        return untied

    # ---- steps ----
    def _input_key(self, batch: dict) -> str:
        return "input_ids" if "input_ids" in batch else "images"

    def train_step(self, batch: dict) -> StepOut:
        from ddlbench.adapters.stage_context import mean_over, ring
        losses: list = []
        with ring(self.cp_mesh, batch, self.blocks) if self.cp_mesh is not None else nullcontext(
                (batch[self._input_key(batch)], batch.get("labels"))) as (inputs, labels):
            parts = zip(inputs.tensor_split(self.repeats), labels.tensor_split(self.repeats)
                        if labels is not None else [None] * self.repeats)
            with self.precision.forward_context(), loss_parallel() if self.options.loss_parallel else nullcontext():
                for x, y in parts:      # the schedule once, or once per n_microbatches of the step's micro-batches
                    mine: list = []     # torch clears the list it is given
                    self.schedule.step(*((x,) if self.first else ()), target=y if self.last else None,
                                       losses=mine if self.last else None)
                    losses += mine
        for p in self.local_params if self.repeats > 1 else ():     # the sum over the step's micro-batches
            if p.grad is not None:
                p.grad.div_(self.dims.grad_accum)
        self._sync_grads()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack([l.detach().float() for l in losses]).mean() if losses else None
        return StepOut(loss=mean_over(loss, self.cp_mesh.get_group()) if loss is not None and self.cp_mesh else loss)

    def _sync_grads(self) -> None:
        from ddlbench.adapters.stages import sum_tied_gradients
        sum_tied_gradients(self._tied)
        if self.options.sequence_parallel:      # the norms' weights saw parts of the sequence
            for module in self.stage_modules:
                sum_partial_grads(module)
        from ddlbench.adapters.stages import average_replica_gradients, divide_expert_gradients
        if self.dp_group is not None:
            average_replica_gradients(self.local_params, self.dims.dp, self.dp_group, self.expert_ids, self.ep_mesh)
        elif self.expert_ids:
            divide_expert_gradients(self.local_params, self.expert_ids, self.options.ep)

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Forward only, stage by stage in stage order (blocking p2p between ranks); the last
        stage's tp-rank 0 returns the sums, every other rank zeros (the evaluator sums over all)."""
        self.model.eval()
        try:
            with torch.no_grad(), self.precision.forward_context():
                h = batch[self._input_key(batch)]
                for s, owner in enumerate(self.owners):
                    if owner != self.pp_rank:
                        continue
                    if s > 0 and self.owners[s - 1] != self.pp_rank:
                        h = recv_any(self.pp_ranks[self.owners[s - 1]], self.ctx.device)
                    h = self.stage_modules[self.local_ids.index(s)](h)
                    if s + 1 < len(self.owners) and self.owners[s + 1] != self.pp_rank:
                        send_any(h.float(), self.pp_ranks[self.owners[s + 1]])
                if self.last and self.tp_rank == 0 and self.cp_rank == 0:
                    return self.loss(h, batch["labels"], batch["eval_weight"]).float()
                return torch.zeros(3, device=self.ctx.device)
        finally:
            self.model.train()

    # ---- reporting ----
    def busy_probe(self):
        """(passes, repeats per step) for the runner's busy-time probe after the window: one
        callable per local stage running its forward+backward on a captured micro-batch, with no
        communication, and the micro-batches per step. None with tensor parallelism inside the
        stages (their passes communicate: they cannot be timed without their peers' waits) or
        before anything was captured. The adapter reads no clock (ddlbench/rank/runner.py times these)."""
        if len(self._inputs) < len(self.local_ids) or self.dims.tp > 1 or self.dims.dp_shard > 1 or self.expert_ids \
                or self.dims.cp > 1:
            return None

        def one_pass(module, x):
            def run():
                inp = x.clone().requires_grad_(x.is_floating_point())
                with self.precision.forward_context():
                    out = module(inp)
                out.float().sum().backward()
            return run
        return [one_pass(m, self._inputs[s]) for m, s in zip(self.stage_modules, self.local_ids)], self.dims.grad_accum

    def after_busy_probe(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def rank_stats(self) -> dict:
        optim = getattr(self.optimizer, "defaults", {})
        opt_bytes = optimizer_state_bytes_per_param(
            "adamw" if "betas" in optim else "sgd", float(optim.get("momentum", 0.0) or 0.0))
        return {"pp_rank": self.pp_rank, "dp_rank": self.dp_rank, "tp_rank": self.tp_rank,
                "stages": self.local_ids, "pieces": [list(self.ranges[s]) for s in self.local_ids],
                "params": self.local_param_count,
                "model_state_bytes_theory": self.local_param_count * (4 + 4 + opt_bytes)}

    def summarize_rank_stats(self, stats: list[dict], per_rank_median_s: list[float]) -> dict:
        return pipeline_summary(self.options.schedule, self.dims.pp, self.variant.stages_per_rank(),
                                self.n_microbatches, stats, per_rank_median_s)

    def param_stats(self) -> list[tuple[int, list[float]]]:
        from ddlbench.adapters.stages import whole_parameter
        mine = [(key, (p.ndim, param_row(canon(whole_parameter(p, self.expert_ids, self.ep_mesh)))))
                for key, p, canon in self._ordered]
        gathered: list = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, mine)
        merged = dict(item for rank_items in gathered for item in rank_items)
        return [merged[i] for i in sorted(merged)]

    def describe(self) -> dict:
        from ddlbench.adapters.stages import inner_parallelisms
        o, dims = self.options, self.dims
        native = {
            "api": "torch.distributed.pipelining (PipelineStage + " + SCHEDULES[o.schedule] + ")",
            "schedule": o.schedule, "n_microbatches": self.n_microbatches, "schedule_repeats": self.repeats,
            "stages": len(self.owners), "stages_per_rank": self.variant.stages_per_rank(),
            "stage_owner_pp_rank": self.owners, "stage_pieces": [list(r) for r in self.ranges],
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.mesh_dim_names)},
            "tied_weights": "gradient summed between the two pipeline ranks holding a copy"
                            if self._tied else "none across ranks",
            "dp_gradient_sync": ("flattened all-reduce (mean) over dp after the schedule" if self.dp_group is not None
                                 else f"FSDP2 reduce-scatter over dp_shard{' x cp' if dims.cp > 1 else ''} at each "
                                 "schedule's last micro-batch's backward"
                                 + (" + all-reduce over dp_replicate (HSDP)" if dims.dp_replicate > 1 else "")
                                 if dims.dp_shard * dims.cp > 1 else None),
            "fsdp": None if self.sharded is None else {
                "api": "torch.distributed.fsdp.fully_shard per block and per stage", "units_per_stage": self.sharded.units,
                "reshard_after_forward": False, "mixed_precision": self.sharded.mp_record(),
                "order": "tensor parallel -> activation checkpointing -> FSDP2 (torchtitan's)"},
            **inner_parallelisms(o, dims),
            "activation_checkpointing": describe_ac(o.activation_checkpointing),
            "checkpointed_blocks_this_rank": self.checkpointed,
            "scale_grads": self.repeats == 1, "backend": self.ctx.backend,
        }
        if self.repeats > 1:
            native["gradient_scaling"] = f"accumulated over {self.repeats} schedules, divided by {dims.grad_accum} once"
        return {"version": torch.__version__, "native_config": native}
