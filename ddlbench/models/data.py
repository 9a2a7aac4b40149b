"""Seeded synthetic data whose global batch does not depend on the world size.

Sample i of the global stream is generated from (seed, i) alone. Data-parallel rank r of dp
takes the contiguous slice [r*local, (r+1)*local) of each global batch, so DDP at 2 ranks and a
single process see exactly the same samples per optimizer step.
"""
from __future__ import annotations

import torch

from ddlbench.models.spec import ModelSpec

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, i) over the generator's seed space


def sample_seed(seed: int, index: int) -> int:
    return (seed * _MIX + index) % (2**63 - 1)


class SyntheticData:
    """A pool of `pool_batches` distinct global batches, materialised (this rank's slice only)
    before the timed window and cycled by step, so that data generation is never timed."""

    def __init__(self, spec: ModelSpec, seed: int, global_batch: int, dp_rank: int,
                 local_batch: int, pool_batches: int, device: torch.device):
        self.local_batch = local_batch
        self._pool = [self._make(spec, seed, b * global_batch + dp_rank * local_batch, device)
                      for b in range(pool_batches)]

    def _make(self, spec: ModelSpec, seed: int, first: int, device) -> dict:
        gen = torch.Generator()
        samples = []
        for i in range(first, first + self.local_batch):
            gen.manual_seed(sample_seed(seed, i))
            samples.append(spec.sample(gen))
        return {k: torch.stack([s[k] for s in samples]).to(device) for k in samples[0]}

    def batch(self, step: int) -> dict:
        return self._pool[step % len(self._pool)]
