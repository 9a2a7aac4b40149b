"""The per-rank half of an adapter (docs/design.md §3): the Strategy a rank builds from its
Variant (ddlbench/adapters/variant.py), with the optional abilities as small interfaces.

The runner owns the clock. A strategy builds the model and optimizer its framework's way,
performs whole training steps, and reports what it really did. It never times itself, never
changes learning rate, batch size or precision, and records its native configuration.
Helpers several strategies share are in common.py; parallelisms applied to a model in parallelize.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from ddlbench.adapters.common import canonical_parameters, full_tensor, param_row, unwrap
from ddlbench.adapters.precision import Autocast, Precision
from ddlbench.settings.dims import ParallelDims

if TYPE_CHECKING:
    from ddlbench.adapters.variant import Variant


@dataclass(frozen=True)
class RankContext:
    """Where this process sits: filled by the launcher before the strategy exists."""
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str          # gloo | nccl
    precision: str        # fp32 | bf16 | fp16 (the run's; strategies must honour it)
    hosts: tuple[str, ...] = ()   # every rank's host, in rank order, exchanged once when the
                                  # process group forms (empty where no launcher filled it)
    compile: bool = False         # run.compile: torch.compile as the framework recommends
    float8: bool = False          # run.float8: float8 linear layers (parallelize.apply_float8)


@dataclass
class StepOut:
    loss: Optional[torch.Tensor]   # this rank's mean loss over its samples (detached); None if
                                   # the rank holds no loss (e.g. a non-last pipeline stage)


ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class Strategy:
    """What the runner drives on every rank. Subclasses implement setup and train_step; the
    attributes below are filled by setup where known and read by the runner and the collector."""

    def __init__(self, variant: "Variant", ctx: RankContext, dims: ParallelDims):
        self.variant = variant
        self.options = variant.options
        self.ctx = ctx
        self.dims = dims
        self.model: Optional[nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        # how the run's precision is applied (ddlbench/adapters/precision.py); a strategy whose
        # framework casts itself replaces it in setup with a FrameworkCast
        self.precision: Precision = Autocast(ctx.device, ctx.precision)
        self.params: Optional[int] = None     # parameters of the full model (not this rank's shard)
        self.dp_rank: int = ctx.rank          # this rank's data-parallel index: which data shard it reads
        # the nodes this strategy's process groups assume when it emulates them (DASO's
        # ranks_per_node: lists of ranks); None = the hosts the ranks run on (ddlbench/comm/topology.py).
        # The runner's collective counter splits intra/inter-node by them.
        self.node_groups: Optional[list[list[int]]] = None
        # ranks per node (or per shard group: FSDP2 hybrid) its cost model assumes
        self.per_node: Optional[int] = None

    def setup(self, build_model: ModelFactory, build_optimizer: OptimizerFactory) -> None:
        raise NotImplementedError

    def train_step(self, batch: dict) -> StepOut:
        raise NotImplementedError

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Weighted sums [loss, correct, predictions] over this rank's validation batch (it
        carries `eval_weight`), through the framework's own wrapper, so sharded parameters are
        gathered as in training. Every rank calls it equally often."""
        self.model.eval()
        try:
            with torch.no_grad(), self.precision.forward_context():
                return self.model(**self.precision.inputs(batch)).float()
        finally:
            self.model.train()

    def param_stats(self) -> list[tuple[int, list[float]]]:
        """(ndim, param_row) of every full parameter (tied weights once), in the model's order:
        equal across equivalent strategies. Sharded strategies gather (collective: all ranks call it)."""
        return [(p.ndim, param_row(canon(full_tensor(p)))) for p, canon in canonical_parameters(unwrap(self.model))]

    def describe(self) -> dict:
        return {"version": torch.__version__, "native_config": {}}

    def moe_record(self) -> dict:
        """A Mixture-of-Experts model's layout, for the record: expert-parallel degree and what the
        all-to-all carried (the expert-parallel strategy says more; the others run every expert on
        every rank)."""
        return {"ep": 1, "experts_per_rank": "all (no expert parallelism)"}

    def checkpoint_saver(self, group):
        """What saves this rank's training state (run.checkpoint): DCP of the model's and optimizer's
        state dicts unless the framework saves its own way (ddlbench/adapters/checkpoint.py)."""
        from ddlbench.adapters.checkpoint import DcpSaver
        return DcpSaver(self.model, self.optimizer, group)

    def teardown(self) -> None:
        self.model = None
        self.optimizer = None


# ---- optional abilities: a strategy that has one subclasses its interface -------------------
class Periodic:
    """A strategy with phases or one that communicates every k steps (local SGD, DASO)."""

    def plan_steps(self, total: int, steps_per_epoch: Optional[int]) -> None:
        """Told once before the loop: how many training steps the run takes."""

    def comm_probe_steps(self) -> int:
        """Called once, right before the runner's comm probe: how many steps to measure (one
        period). A strategy with phases may switch to its steady state here."""
        return 1


class CountsOwnCollectives:
    """A strategy whose collectives bypass c10d (Horovod) and so counts them itself."""

    def comm_stats(self) -> dict:
        """{kind: {'bytes': int, 'calls': int}} since the last call."""
        raise NotImplementedError


class ModelParallel:
    """A strategy whose ranks hold different parts of the model (pipeline stages): its per-rank
    facts and a busy-time probe for the runner, after the window."""

    def busy_probe(self) -> Optional[tuple[list[Callable[[], None]], int]]:
        """(passes, repeats per step): callables that each run one part of a step with no
        communication, and how often a step runs each. None = no probe. The runner times them."""
        return None

    def after_busy_probe(self) -> None:
        """Undo what the busy probe left behind (its gradients), once it has run."""

    def rank_stats(self) -> dict:
        """Per-rank facts gathered after the window (stages, params); called on every rank."""
        return {}

    def summarize_rank_stats(self, stats: list[dict], per_rank_median_s: list[float]) -> Optional[dict]:
        """Rank 0: the record's `model_parallel` section from every rank's rank_stats()."""
        return None


def param_fingerprint(strategy: Strategy) -> list[list[float]]:
    """param_row of every full parameter, in the model's order (collective)."""
    return [row for _, row in strategy.param_stats()]
