"""Context parallelism inside pipeline stages (torchtitan's 4-D layout, FSDP x TP x PP x CP, its
Llama 3.1 405B long-context table): each of a stage's `cp` ranks holds 1/cp of every sequence, cut by
torch's head-tail load balancer (ddlbench/adapters/context_parallel.py runs the same ring without a
pipeline), and the stages pass on the rank's part only.

How: the schedule's whole step runs inside torch's `context_parallel` context, which cuts the local
batch's input ids, the targets (shifted over the whole sequence first) and the positions in place and
sends SDPA to the ring in forward and backward; the decoder blocks take the rank's positions for
their rotary embedding (DecoderBlock.positions) while it runs. The last stage's loss is the rank's
summed cross-entropy over (the micro-batch's target count / cp), so the cp ranks' mean is the
micro-batch's mean loss; the parameters are sharded by FSDP2 over dp_shard x cp (torchtitan's fold: the cp
ranks always shard, at dp_shard 1 too), which averages the gradients over them."""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddlbench.settings.dims import sequence_split_errors


def context_errors(mc, cp: int, attention: str) -> list[str]:
    """Why ring attention cannot run this model at this cp (empty: it can); the context-parallel adapter
    (ddlbench/adapters/context_parallel.py) and the pipeline's stages both ask."""
    errors = sequence_split_errors(mc, cp, "cp", "context parallelism", "fsdp_full")
    if errors:
        return errors
    if attention != "sdpa_causal":
        errors.append(f"ring attention runs SDPA with is_causal and no mask: model.attention=sdpa_causal "
                      f"(got {attention})")
    seq = getattr(mc, "seq_len", None)
    if seq and seq % (2 * cp):
        errors.append(f"model.seq_len = {seq} is not divisible by 2 x cp = {2 * cp} (the load balancer cuts "
                      "each sequence into 2 x cp chunks)")
    return errors


def context_stage_errors(cfg, options, dims, attention: str) -> list[str]:
    """Why ring attention cannot run inside these pipeline stages (empty: it can)."""
    errors = context_errors(cfg.model, options.cp, attention)
    if options.ep > 1:
        errors.append(f"framework.options.cp {options.cp} with ep {options.ep} inside pipeline stages is not wired "
                      "(the experts' all-to-all over the replicas with the ring over cp)")
    seq = getattr(cfg.model, "seq_len", None)
    if seq and options.sequence_parallel and (seq // max(options.cp, 1)) % dims.tp:
        errors.append(f"model.seq_len / cp = {seq // options.cp} is not divisible by tp {dims.tp} (sequence "
                      "parallelism cuts each rank's part of the sequence)")
    return errors


def decoder_blocks(stage_modules, expected: int) -> list:
    """The stages' decoder blocks (the pieces that take positions): `expected` of them, or an error rather
    than blocks that would run on positions 0..T/cp - 1 (a family whose pieces are not DecoderBlocks)."""
    from ddlbench.models.decoder import DecoderBlock
    found = [m for stage in stage_modules for m in stage.modules() if isinstance(m, DecoderBlock)]
    if len(found) != expected:
        raise RuntimeError(f"context parallelism inside pipeline stages: {expected} decoder blocks on this rank, "
                           f"{len(found)} of them take the rank's positions (ddlbench.models.decoder.DecoderBlock)")
    return found


def shifted_targets(labels: torch.Tensor) -> torch.Tensor:
    """The next token's id at every position of the whole sequence (the last ignored): cut with the
    inputs, each rank's targets are its positions' own (no shift inside a part)."""
    from ddlbench.models.language import IGNORE
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE)


@contextmanager
def ring(cp_mesh, batch: dict, blocks: list):
    """(ids, targets) of this rank's part of every sequence, inside torch's context_parallel (SDPA on
    the ring); the blocks take the part's positions meanwhile."""
    from torch.distributed.tensor.experimental import context_parallel
    ids = batch["input_ids"].clone()
    target = shifted_targets(batch["labels"])
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1).contiguous()
    cut = [ids, target, positions]
    with context_parallel(cp_mesh, buffers=cut, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(cut)):
        for b in blocks:
            b.positions = positions[:1]
        try:
            yield ids, target
        finally:
            for b in blocks:
                b.positions = None


def part_loss(logits: torch.Tensor, target: torch.Tensor, cp_group) -> torch.Tensor:
    """This rank's summed cross-entropy over (the micro-batch's target count over the cp ranks / cp):
    the cp ranks' losses average to the micro-batch's mean loss."""
    from ddlbench.models.language import IGNORE
    count = (target != IGNORE).sum().float()
    dist.all_reduce(count, group=cp_group)
    cp = dist.get_world_size(cp_group)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE,
                           reduction="sum") / (count / cp)
    from torch.distributed.tensor import DTensor
    return loss.to_local() if isinstance(loss, DTensor) else loss      # loss parallel: a replicated DTensor


def mean_over(loss: torch.Tensor, cp_group) -> torch.Tensor:
    """The cp ranks' mean of their losses (the replica's mean loss)."""
    loss = loss.detach().float().clone()
    dist.all_reduce(loss, group=cp_group)
    return loss / dist.get_world_size(cp_group)
