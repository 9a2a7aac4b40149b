"""The global sample order of a finite dataset, and each data-parallel rank's share of it.

Epoch e visits the training split in one seeded permutation that depends on (seed, e) only.
Global batch b of that epoch is positions [b*G, (b+1)*G) of the permutation; data-parallel rank
r takes the contiguous slice [r*L, (r+1)*L) of it. So every framework, at every world size,
applies exactly the same samples in each optimizer step, and no sample is seen twice per epoch
(the last partial global batch is dropped: `steps_per_epoch = size // G`).

Validation is sharded without duplicates: the split is padded to a multiple of dp x eval batch
with weight-0 copies of sample 0, each rank evaluates its contiguous shard, and the weighted sums
are all-reduced, so every real sample counts exactly once.
"""
from __future__ import annotations

from typing import Iterator

import torch

from ddlbench.models.data import sample_seed
from ddlbench.models.datasets import Split


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(sample_seed(seed, 1_000_003 * (epoch + 1)))
    return torch.randperm(size, generator=gen).tolist()


def rank_batches(size: int, seed: int, epoch: int, global_batch: int, dp_rank: int,
                 local_batch: int) -> list[list[int]]:
    order = epoch_order(size, seed, epoch)
    lo = dp_rank * local_batch
    return [order[b * global_batch + lo: b * global_batch + lo + local_batch]
            for b in range(size // global_batch)]


def eval_shards(size: int, dp: int, dp_rank: int, batch: int) -> list[tuple[list[int], list[float]]]:
    """This rank's validation batches as (indices, weights); weight 0 marks padding."""
    chunk = dp * batch
    padded = -(-size // chunk) * chunk
    per_rank = padded // dp
    idx = list(range(dp_rank * per_rank, (dp_rank + 1) * per_rank))
    out = []
    for i in range(0, per_rank, batch):
        part = idx[i:i + batch]
        out.append(([j if j < size else 0 for j in part], [1.0 if j < size else 0.0 for j in part]))
    return out


class TrainStream:
    """Yields this rank's local batches, epoch by epoch, on `device`. With num_workers > 0 a
    torch DataLoader fetches them in worker processes (ImageFolder/text on a cluster)."""

    def __init__(self, split: Split, seed: int, global_batch: int, dp_rank: int, local_batch: int,
                 device: torch.device, num_workers: int = 0):
        if split.size < global_batch:
            raise ValueError(f"the training split has {split.size} samples, fewer than one global "
                             f"batch ({global_batch})")
        self.split, self.seed, self.global_batch = split, seed, global_batch
        self.dp_rank, self.local_batch, self.device, self.num_workers = dp_rank, local_batch, device, num_workers
        self.steps_per_epoch = split.size // global_batch

    def epoch(self, epoch: int) -> Iterator[dict]:
        batches = rank_batches(self.split.size, self.seed, epoch, self.global_batch, self.dp_rank,
                               self.local_batch)
        if self.num_workers:
            from torch.utils.data import DataLoader
            source = DataLoader(self.split, sampler=batches, batch_size=None, num_workers=self.num_workers,
                                pin_memory=self.device.type == "cuda")
        else:
            source = (self.split[b] for b in batches)
        for batch in source:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def forever(self) -> Iterator[dict]:
        epoch = 0
        while True:
            yield from self.epoch(epoch)
            epoch += 1
