"""DeepSpeed-Ulysses sequence parallelism with ZeRO (Jacobs et al. 2023; DeepSpeed's current
integration for transformers models, ALST: deepspeed.runtime.sequence_parallel.ulysses_sp).

`sp` ranks share each data-parallel replica's samples, each holding 1/sp of every sequence
(`parallel.cp`). transformers' SDPA attention is wrapped by DeepSpeed's UlyssesSPAttentionHF:
before attention an all-to-all turns (this rank's part of the sequence, all heads) into (the whole
sequence, 1/sp of the heads); SDPA runs causal on it; a second all-to-all turns the output back.
Everything else (embeddings, norms, MLP, head) runs on the rank's part of the sequence. Each rank's
loss is the summed cross-entropy of its part over the whole sequence's target count (positions and
shifted targets cut from the whole sequence), so the parts add up to the mean; DeepSpeed's engine,
given the sequence-parallel groups (its `mpu`), sums the gradients over the sp ranks and averages
them over the data-parallel ones. The reported loss is the sum over the sp ranks (the mean).
Evaluation runs whole sequences on every rank (disable_in_eval), counted once per replica.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from ddlbench.adapters.base import StepOut
from ddlbench.adapters.common import split_micro
from ddlbench.adapters.cost import DTYPE_BYTES
from ddlbench.adapters.deepspeed import DeepSpeed, DeepSpeedOptions, DeepSpeedStrategy
from ddlbench.adapters.variant import taxonomy_labels
from ddlbench.errors import ConfigError
from ddlbench.settings.dims import ParallelSize, sequence_split_errors


class UlyssesOptions(DeepSpeedOptions):
    stage: Literal[0, 1, 2, 3] = 2
    sp: ParallelSize = -1            # sequence-parallel ranks; -1 = all of them (one data-parallel replica)


def sequence_errors(mc, sp: int, attention: str) -> list[str]:
    """Why DeepSpeed-Ulysses cannot run this model at this sp (empty: it can)."""
    errors = sequence_split_errors(mc, sp, "sp", "DeepSpeed-Ulysses", "deepspeed_zero2")
    if errors:
        return errors
    if attention != "sdpa":
        errors.append(f"DeepSpeed-Ulysses wraps SDPA attention: model.attention=sdpa (got {attention}; eager "
                      "attention materialises the mask, which the sequence parts cannot share)")
    for key in ("n_head", "n_kv_head", "seq_len"):
        value = getattr(mc, key, None)
        if value and value % sp:
            errors.append(f"model.{key} = {value} is not divisible by sp = {sp}")
    return errors


class DeepSpeedUlysses(DeepSpeed):
    name = "deepspeed_ulysses"
    Options = UlyssesOptions
    strategy = "ddlbench.adapters.ulysses:UlyssesStrategy"

    def abilities(self):      # compile and float8 not wired through the sequence-parallel engine; it wraps SDPA
        from dataclasses import replace
        base = super().abilities()
        return replace(base, compiles=False, float8=False, settles={"model.attention": "sdpa"},
                       step=replace(base.step, sequence="all_to_all", grads_over_world=True))

    def parallel_shape(self, cfg) -> dict:
        """`cp` = sp ranks per replica; ZeRO-3 shards over the replicas (dp_shard), 0-2 replicate."""
        sp = self.options.sp
        if sp == -1:        # every rank in one sequence-parallel group: a single replica
            return {"cp": -1, "dp_replicate": 1, "dp_shard": 1}
        return {**({"dp_shard": -1, "dp_replicate": 1} if self.options.stage == 3 else {}), "cp": sp}

    def check_config(self, cfg, dims) -> None:
        from ddlbench.models.language import attention_impl
        super().check_config(cfg, dims)
        device = "cuda" if cfg.run.device == "cuda" else "cpu"
        errors = sequence_errors(cfg.model, dims.cp, attention_impl(getattr(cfg.model, "attention", "auto"), device))
        if errors:
            raise ConfigError("; ".join(errors))

    def taxonomy(self) -> dict:
        base = super().taxonomy()
        return taxonomy_labels("sequence (Ulysses) + " + base["parallelism"], "sync",
                               "all-to-all (attention) + " + base["communication"], base["sharding"], base["compression"])

    def cost_model(self, dims, model, precision, per_node=None):
        """ZeRO as DeepSpeed runs it with the sequence-parallel groups: over every rank (its
        seq_data_parallel group: the sp ranks of a replica and the replicas), so the state is
        sharded world-wide; each rank computes and keeps the activations of 1/sp of the sequence;
        per layer and micro-batch four all-to-alls in forward (q, k, v: the part's heads; the
        output back) and four in backward, among the sp ranks (adjacent), each the rank's part of
        that tensor in the activations' dtype (measured: tests/test_ulysses.py)."""
        from dataclasses import replace

        from ddlbench.adapters.cost import split
        world = dims.world_size
        zero = super().cost_model(replace(dims, dp=world, dp_replicate=world // dims.dp_shard), model, precision, per_node)
        sp, m = dims.cp, dims.grad_accum
        act = model.boundary_bytes_per_sample * dims.micro_batch / 4 * DTYPE_BYTES[precision] / sp   # the part's q / output
        kv = model.kv_heads / model.attention_heads if model.attention_heads else 1.0
        traffic = (split("all_to_all", act, 1, sp, per_step=4 * model.blocks * m, what="q and the output (sequence parts)",
                         data_parallel=False)
                   + split("all_to_all", act * kv, 1, sp, per_step=4 * model.blocks * m, what="k and v (sequence parts)",
                           data_parallel=False))
        return replace(zero, source=zero.source + f" + DeepSpeed-Ulysses (sp {sp})", traffic=zero.traffic + tuple(traffic),
                       activation_share=zero.activation_share / sp, compute_share=zero.compute_share / sp)

    def analytic_comm(self, dims, precision, params, per_node=None):
        return None


class UlyssesStrategy(DeepSpeedStrategy):
    def prepare_model(self, model):
        """Register DeepSpeed's Ulysses attention for this model (it wraps the model's SDPA attention
        function) and make the sequence-parallel groups (the engine's mpu)."""
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        cfg = model.net.config
        self.seq_len = cfg.max_position_embeddings
        self.mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model.net, core_attn_implementation=cfg._attn_implementation,
            sequence_parallel_size=self.dims.cp, micro_batch_size=self.dims.micro_batch,
            seq_length=self.seq_len, seq_length_is_variable=False, disable_in_eval=True)
        self.sp_group = self.mpu.get_sequence_parallel_group()
        self.sp_rank = self.mpu.get_sequence_parallel_rank()
        # the ranks of one sequence-parallel group read the same samples (their replica's shard)
        self.dp_rank = self.dims.dp_rank(self.ctx.rank)
        if self.sp_rank != self.dims.coords(self.ctx.rank).get("cp", 0):
            raise RuntimeError(f"DeepSpeed's sequence-parallel rank {self.sp_rank} is not the mesh's cp coordinate "
                               f"{self.dims.coords(self.ctx.rank).get('cp', 0)} (rank {self.ctx.rank})")
        return model

    def initialize_kwargs(self) -> dict:
        return {"mpu": self.mpu}

    def train_step(self, batch: dict) -> StepOut:
        import torch.distributed as dist

        from ddlbench.models.language import IGNORE
        engine, sp = self.model, self.dims.cp
        micro = split_micro(batch, self.dims.grad_accum)
        total = torch.zeros((), device=self.ctx.device)
        for mb in micro:
            inputs = self.precision.inputs(mb)
            ids = inputs["input_ids"]
            part = ids.shape[1] // sp
            cut = slice(self.sp_rank * part, (self.sp_rank + 1) * part)
            target = F.pad(inputs["labels"][:, 1:], (0, 1), value=IGNORE)   # shifted over the whole sequence
            positions = torch.arange(ids.shape[1], device=ids.device)[cut].unsqueeze(0).expand(ids.shape[0], -1)
            loss = engine(input_ids=ids[:, cut], position_ids=positions, shift_labels=target[:, cut],
                          loss_denominator=(target != IGNORE).sum())
            engine.backward(loss)
            engine.step()
            whole = loss.detach().float().clone()
            dist.all_reduce(whole, group=self.sp_group)     # the parts' losses add up to the mean
            total += whole
        return StepOut(loss=total / len(micro))

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Every sp rank evaluates the whole sequences alike; only sp rank 0 contributes."""
        sums = super().eval_step(batch)
        return sums if self.sp_rank == 0 else torch.zeros_like(sums)

    def describe(self) -> dict:
        out = super().describe()
        out["native_config"]["sequence_parallel"] = {
            "api": "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF (ALST) + engine mpu",
            "sp": self.dims.cp, "core_attention": "sdpa", "seq_length": self.seq_len,
            "per_rank": "1/sp of each sequence; all-to-all to 1/sp of the heads around attention",
            "loss": "summed cross-entropy of the rank's part / the whole sequence's targets; summed over sp"}
        return out
