"""Quality mode (run.epochs set): the batch source, when to evaluate, and the evaluation itself.

The runner calls these between steps; evaluation time is never part of a step time. Every rank
evaluates its shard of the validation split through the adapter (so FSDP/ZeRO-3 gather as in
training) and one all-reduce sums [loss, correct, predictions] over ranks.
"""
from __future__ import annotations

import itertools
import time
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from ddlbench.models.data import SyntheticData
from ddlbench.models.datasets import Dataset
from ddlbench.models.loader import TrainStream, eval_shards


def batch_source(dataset: Optional[Dataset], cfg, spec, dims, dp_rank: int, device,
                 start: int = 0) -> tuple[Iterator[dict], Optional[int]]:
    """(iterator of local batches from step `start` on, steps per epoch or None). Random synthetic data
    is a pool materialised before the window; datasets are fetched inside the step, as in real
    training (a resumed run skips the batches its checkpoint has trained on)."""
    if dataset is None:
        pool = SyntheticData(spec, cfg.run.seed, dims.global_batch, dp_rank, dims.local_batch,
                             cfg.data.pool_batches, device)
        return (pool.batch(s) for s in itertools.count(start)), None
    stream = TrainStream(dataset.train, cfg.run.seed, dims.global_batch, dp_rank, dims.local_batch,
                         device, getattr(cfg.data, "num_workers", 0))
    return itertools.islice(stream.forever(), start, None), stream.steps_per_epoch


def evaluate_split(adapter, split, dims, dp_rank: int, device) -> dict:
    """Mean loss and accuracy of the current parameters over a whole split (every rank calls
    it; each evaluates its shard through the adapter, one all-reduce sums them)."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for indices, weights in eval_shards(split.size, dims.dp, dp_rank, dims.micro_batch):
        batch = {k: v.to(device) for k, v in split[indices].items()}
        batch["eval_weight"] = torch.tensor(weights, device=device)
        sums += adapter.eval_step(batch).double()
    # sum over all ranks: model-parallel adapters return zeros except on one rank per
    # data-parallel replica (pipeline: last stage; tensor parallel: tp rank 0)
    dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    return {"loss": loss_sum / count, "accuracy": correct / count, "predictions": int(round(count))}


class Evaluator:
    def __init__(self, adapter, dataset: Dataset, dims, dp_rank: int, device: torch.device,
                 steps_per_epoch: int, eval_every: Optional[int]):
        self.adapter, self.val, self.device = adapter, dataset.val, device
        self.dims, self.dp_rank = dims, dp_rank
        self.steps_per_epoch, self.eval_every = steps_per_epoch, eval_every

    def due(self, steps_done: int) -> bool:
        return steps_done % self.steps_per_epoch == 0 or bool(self.eval_every and steps_done % self.eval_every == 0)

    def __call__(self, steps_done: int) -> dict:
        t0 = time.perf_counter()
        out = evaluate_split(self.adapter, self.val, self.dims, self.dp_rank, self.device)
        return {"step": steps_done, "epoch": steps_done / self.steps_per_epoch, **out,
                "eval_s": time.perf_counter() - t0}


def final_objective(adapter, dataset: Dataset, dims, dp_rank: int, device, optim_cfg, steps: int) -> dict:
    """The regularised training objective at the parameters after `steps` training steps
    (collective; outside every timed step)."""
    from ddlbench.adapters.optim import regularised_objective

    train = evaluate_split(adapter, dataset.train, dims, dp_rank, device)
    out = regularised_objective(train["loss"], adapter.param_stats(), optim_cfg.weight_decay,
                                optim_cfg.exclude_from_decay)
    return {**out, "train_accuracy": train["accuracy"], "samples": train["predictions"], "after_steps": steps}
