"""Parallel dimensions of a run: validated, pure, testable without a process group."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.errors import ConfigError


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp: int
    tp: int
    pp: int
    micro_batch: int     # samples per rank per forward/backward
    grad_accum: int      # micro-batches per optimizer step
    global_batch: int    # samples per optimizer step, all data-parallel ranks together
    nodes: int = 1

    @property
    def local_batch(self) -> int:
        """Samples one data-parallel rank consumes per optimizer step."""
        return self.micro_batch * self.grad_accum

    def as_dict(self) -> dict:
        return {"world_size": self.world_size, "nodes": self.nodes, "dp": self.dp, "tp": self.tp,
                "pp": self.pp, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "global_batch": self.global_batch}


def resolve_dims(world_size: int, global_batch: int, micro_batch: Optional[int],
                 tp: int = 1, pp: int = 1, nodes: int = 1) -> ParallelDims:
    """Derive dp and grad_accum; raise ConfigError naming the keys when they cannot fit."""
    if world_size < 1:
        raise ConfigError(f"launcher.nproc: world size must be >= 1, got {world_size}")
    if world_size % (tp * pp):
        raise ConfigError(f"world size {world_size} is not divisible by tp*pp = {tp}*{pp}")
    dp = world_size // (tp * pp)
    if micro_batch is None:
        if global_batch % dp:
            raise ConfigError(f"run.global_batch {global_batch} is not divisible by dp={dp} ranks "
                              f"(valid: a multiple of {dp})")
        micro_batch = global_batch // dp
    if global_batch % (dp * micro_batch):
        raise ConfigError(f"run.global_batch {global_batch} is not divisible by dp ranks x "
                          f"run.micro_batch = {dp} x {micro_batch} (valid: a multiple of "
                          f"{dp * micro_batch})")
    return ParallelDims(world_size=world_size, dp=dp, tp=tp, pp=pp, micro_batch=micro_batch,
                        grad_accum=global_batch // (dp * micro_batch), global_batch=global_batch,
                        nodes=nodes)
