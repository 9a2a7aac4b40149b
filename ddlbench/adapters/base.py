"""The adapter contract (docs/design.md §3); the helpers adapters share are in common.py.

The runner owns the clock. An adapter builds the model and optimizer its framework's way,
performs whole training steps, and reports what it really did. It never times itself, never
changes learning rate, batch size or precision, and records its native configuration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from ddlbench.adapters.common import autocast, canonical_parameters, param_row, peak_rss_bytes, taxonomy_labels, unwrap
from ddlbench.dims import ParallelDims

if TYPE_CHECKING:
    from ddlbench.adapters.cost import CostModel, ModelProfile
    from ddlbench.metrics.comm import AnalyticComm


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class RankContext:
    """Where this process sits: filled by the launcher before the adapter exists."""
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str          # gloo | nccl
    precision: str        # fp32 | bf16 | fp16 (the run's; adapters must honour it)
    hosts: tuple[str, ...] = ()   # every rank's host, in rank order, exchanged once when the
                                  # process group forms (empty where no launcher filled it)


@dataclass
class StepOut:
    loss: Optional[torch.Tensor]   # this rank's mean loss over its samples (detached); None if
                                   # the rank holds no loss (e.g. a non-last pipeline stage)


ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class Adapter:
    """The contract between a framework and the harness, with working defaults: subclasses
    implement setup and train_step. Everything the runner, the collector and the launchers read
    from an adapter is declared here (class members, the attributes set in __init__, methods)."""

    name: ClassVar[str] = "base"
    Options: ClassVar[type[BaseModel]] = NoOptions
    # How the launchers start this framework's ranks: "elastic" (torch's elastic agent,
    # ddlbench.launch) or "horovodrun" (Horovod's own launcher).
    launch: ClassVar[str] = "elastic"
    # modules the launcher imports once before it forks CPU ranks (ddlbench.launch.local.preload);
    # only modules that merely import (no threads, no device work at import)
    preload_modules: ClassVar[tuple[str, ...]] = ()

    # ---- class-level checks, run at compose time (no process group yet) ----
    @classmethod
    def parallel_shape(cls, options, cfg) -> dict:
        """Keyword arguments for ddlbench.dims.resolve_dims: the tp, pp, dp_shard (and pipeline
        n_microbatches) this variant uses; data parallelism (dp_replicate) takes the rest."""
        return {}

    @classmethod
    def check_config(cls, options, cfg, dims: ParallelDims) -> None:
        """Raise ConfigError for combinations this framework cannot take."""

    @classmethod
    def taxonomy(cls, options) -> dict:
        """Labels from the survey's taxonomy, shown in the report: parallelism (data, pipeline,
        tensor, hybrid), synchronisation (sync, periodic, stale, async), communication pattern
        (all-reduce, all-gather/reduce-scatter, broadcast, parameter-server, p2p), sharding, and
        compression of what is communicated."""
        return taxonomy_labels(parallelism="data", sync="sync", pattern="all-reduce")

    @classmethod
    def unsupported_reason(cls, options, cfg, device_type: str) -> Optional[str]:
        """Why this variant cannot run here (missing package, device), or None."""
        return None

    @classmethod
    def grad_reduce_dtype(cls, options, precision: str) -> str:
        """The dtype in which gradients cross the network at this run precision (a parity field:
        at bf16 DeepSpeed reduces in bf16 by default, DDP/FSDP2/Horovod in fp32). Default: the
        gradients of fp32 parameters under autocast, reduced as they are."""
        return "fp32"

    @classmethod
    def dry_run_info(cls, options, cfg, dims: ParallelDims) -> dict:
        """What `run.dry_run=true` prints beyond the dims (one CPU process, no process group)."""
        return {}

    @classmethod
    def launch_env(cls, options) -> dict:
        """Environment variables the framework reads at start-up (set by the launcher)."""
        return {}

    @classmethod
    def cost_model(cls, options, dims: ParallelDims, model: "ModelProfile", precision: str,
                   per_node: Optional[int] = None) -> Optional["CostModel"]:
        """What this variant holds and sends per optimizer step on `dims` (ddlbench.adapters.cost):
        what is sharded and over which ranks, its buffers, its collectives (per micro-batch where
        the framework communicates per micro-batch), its pipeline bubble. `per_node`: ranks per
        node where the variant's groups follow the nodes. None = no cost model (bench advise
        then prunes the variant, saying so)."""
        return None

    @classmethod
    def advise_options(cls, options, devices: int) -> list[dict]:
        """The option edits `bench advise` tries for this variant on `devices` ranks (its ways of
        splitting them: tp sizes, pipeline depths, shard-group sizes); [{}] = the variant as is."""
        return [{}]

    # ---- per-rank lifecycle ----
    def __init__(self, options, ctx: RankContext, dims: ParallelDims):
        self.options = options
        self.ctx = ctx
        self.dims = dims
        self.model: Optional[nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        # Set by setup() where known; read by the runner and the collector after it:
        self.params: Optional[int] = None     # parameters of the full model (not this rank's shard)
        self.dp_rank: int = ctx.rank          # this rank's data-parallel index: which data shard it reads
        # the nodes this adapter's process groups assume when it emulates them (DASO's
        # ranks_per_node: lists of ranks); None = the hosts the ranks run on (ddlbench/topology.py).
        # The runner's collective counter splits intra/inter-node by them.
        self.node_groups: Optional[list[list[int]]] = None
        # ranks per node (or per shard group: FSDP2 hybrid) its cost model assumes
        self.per_node: Optional[int] = None
        self.scaler = None   # torch.amp.GradScaler where fp16 runs scale the loss themselves
        self._setup_peaks: dict = {}

    def setup(self, build_model: ModelFactory, build_optimizer: OptimizerFactory) -> None:
        raise NotImplementedError

    def train_step(self, batch: dict) -> StepOut:
        raise NotImplementedError

    def step_optimizer(self) -> None:
        """optimizer.step (through the GradScaler when fp16 has one), then drop the gradients."""
        scaler = self.scaler
        if scaler:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def plan_steps(self, total: int, steps_per_epoch: Optional[int]) -> None:
        """Told once before the loop: how many training steps the run takes (schedules with
        phases, e.g. DASO's cool-down, need it)."""

    def eval_step(self, batch: dict) -> torch.Tensor:
        """Weighted sums [loss, correct, predictions] over this rank's validation batch (it
        carries `eval_weight`), through the framework's own wrapper, so sharded parameters are
        gathered as in training. Every rank calls it equally often."""
        self.model.eval()
        try:
            with torch.no_grad(), self.forward_context():
                return self.model(**self.prepare_inputs(batch)).float()
        finally:
            self.model.train()

    def forward_context(self):
        """Precision context around forward (autocast; none where the framework casts itself)."""
        return autocast(self.ctx)

    def prepare_inputs(self, batch: dict) -> dict:
        return batch

    def precision_summary(self) -> str:
        """How the run's precision is applied, for native_config.mixed_precision (the runner adds
        it where an adapter's describe() does not say)."""
        if self.ctx.precision == "fp32":
            return "none (fp32)"
        scaler = " + torch GradScaler" if self.scaler else ""
        return f"torch.autocast({self.ctx.device.type}, {self.ctx.precision}) around forward, fp32 parameters{scaler}"

    def mark_setup_done(self) -> None:
        """Called by the runner right after setup(): on CUDA, keep setup's peak (the full model
        placed before sharding or offload) and reset the peak counters, so the reported peaks
        are the training loop's (ZeRO-3/FSDP/offload savings stay visible). Host RSS has no
        reset (ru_maxrss): its value here is kept as the setup peak."""
        self._setup_peaks = {"setup_peak_rss_bytes": peak_rss_bytes(), "setup_peak_allocated_bytes": None}
        if self.ctx.device.type == "cuda":
            self._setup_peaks["setup_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.ctx.device)
            torch.cuda.reset_peak_memory_stats(self.ctx.device)

    def memory_stats(self) -> dict:
        """Peaks of the training loop: device allocated/reserved (CUDA, reset after setup), host
        RSS (since process start), and setup's own peaks."""
        out = {"peak_allocated_bytes": None, "peak_reserved_bytes": None,
               "peak_rss_bytes": peak_rss_bytes(), **self._setup_peaks}
        if self.ctx.device.type == "cuda":
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.ctx.device)
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.ctx.device)
        return out

    def model_state_bytes_theory(self, params: int, optimizer: str, momentum: float = 0.0) -> Optional[int]:
        """Theoretical params+grads+optimizer-state bytes per rank for this strategy."""
        return None

    def comm_stats(self) -> Optional[dict]:
        """{kind: {'bytes': int, 'calls': int}} since the last call, for frameworks whose
        collectives bypass c10d (Horovod); None = let the runner's c10d probe count them."""
        return None

    def comm_probe_steps(self) -> int:
        """Called once, right before the runner's comm probe: how many steps to measure — one
        period of a strategy that communicates every k steps (local SGD, DASO). An adapter with
        phases may switch to its steady state here (DASO leaves its cool-down)."""
        return 1

    def analytic_comm(self) -> Optional["AnalyticComm"]:
        """What this strategy sends per step (ddlbench.metrics.comm.AnalyticComm: payload per
        collective kind in units of Psi, the code path it follows, the paper's figure).
        None if there is no simple formula."""
        return None

    def cost_payload_psi(self) -> Optional[dict]:
        """This run's data-parallel payload per step, {kind: units of Psi}, from its cost model
        (the one source for advise's prices and the record's analytic volume); None without one."""
        from ddlbench.adapters.cost import ModelProfile
        prof = ModelProfile(params=self.params or 0, largest_block_params=0, blocks=1, activation_bytes_per_sample=0,
                            checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0)
        cost = type(self).cost_model(self.options, self.dims, prof, self.ctx.precision, self.per_node)
        return None if cost is None else cost.payload_psi()

    def recomputes_blocks(self) -> bool:
        """Whether this run recomputes each block's forward in backward (activation checkpointing)."""
        return bool(getattr(self.options, "activation_checkpointing", False))

    def param_stats(self) -> list[tuple[int, list[float]]]:
        """(ndim, param_row) of every full parameter (tied weights once), in the model's order:
        equal across equivalent strategies. Sharded adapters gather (collective: all ranks call it)."""
        from torch.distributed.tensor import DTensor

        return [(p.ndim, param_row(canon(p.full_tensor() if isinstance(p, DTensor) else p)))
                for p, canon in canonical_parameters(unwrap(self.model))]

    def param_fingerprint(self) -> list[list[float]]:
        """param_row of every full parameter, in the model's order (collective)."""
        return [row for _, row in self.param_stats()]

    def busy_probe(self) -> Optional[tuple[list[Callable[[], None]], int]]:
        """(passes, repeats per step) for the runner's busy-time probe after the window: callables
        that each run one part of a step with no communication (a pipeline stage's forward and
        backward), and how often a step runs each. None = no probe (the runner times them)."""
        return None

    def after_busy_probe(self) -> None:
        """Undo what the busy probe left behind (its gradients), once it has run."""

    def rank_stats(self) -> dict:
        """Per-rank facts gathered after the window (model-parallel adapters: stages, params,
        busy time); {} = none. Called on every rank, after the comm probe."""
        return {}

    def summarize_rank_stats(self, stats: list[dict], per_rank_median_s: list[float]) -> Optional[dict]:
        """Rank 0: the record's `model_parallel` section from every rank's rank_stats()."""
        return None

    def describe(self) -> dict:
        return {"version": torch.__version__, "native_config": {}}

    def teardown(self) -> None:
        self.model = None
        self.optimizer = None
