"""The pure half of an adapter (docs/design.md §3): what a framework variant is and costs,
answerable with no process group, no device and without importing the framework's package.

Validation, `bench advise`'s enumeration and pricing, the launchers' choices and the collector
ask a Variant; only a rank builds the variant's Strategy (ddlbench/adapters/base.py), which
imports the framework. Everything here is a function of the options and the arguments it is given.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Optional

from pydantic import BaseModel, ConfigDict

from ddlbench.adapters.cost import StepRules

if TYPE_CHECKING:
    from ddlbench.adapters.cost import CostModel, ModelProfile
    from ddlbench.metrics.comm import AnalyticComm
    from ddlbench.settings.dims import ParallelDims


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def taxonomy_labels(parallelism: str, sync: str, pattern: str, sharding: str = "none",
                    compression: str = "none") -> dict:
    return {"parallelism": parallelism, "synchronisation": sync, "communication": pattern,
            "sharding": sharding, "compression": compression}


def load(path: str):
    """`module:name` -> the object (a strategy or starter class, named by a variant)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def gpu_capability(device_type: str) -> Optional[tuple]:
    """The smallest visible GPU's compute capability (NVML: no CUDA context), None on CPU or unknown."""
    if device_type != "cuda":
        return None
    try:
        from ddlbench.machine.gpus import visible_gpus
        return visible_gpus().min_capability
    except Exception:     # NVML absent or unreadable: the rank's own check decides
        return None


def checkpoint_reason(variant: "Variant", cfg, device_type: str = "cpu") -> Optional[str]:
    """run.checkpoint in a mode the strategy does not save with: a result that says so."""
    ck = getattr(cfg.run, "checkpoint", None)
    if ck is None or not ck.every:
        return None
    from ddlbench.adapters.checkpoint import NEEDS_CUDA
    if ck.mode in NEEDS_CUDA and device_type != "cuda" and ck.mode in variant.abilities().checkpoints:
        return f"run.checkpoint.mode={ck.mode} runs on CUDA only: {NEEDS_CUDA[ck.mode]}"
    if ck.mode in variant.abilities().checkpoints:
        return None
    offered = variant.abilities().checkpoints
    return (f"run.checkpoint.mode={ck.mode}: the {variant.name} adapter saves "
            + (f"only in mode {', '.join(offered)}" if offered else "no checkpoint yet") + " (its abilities)")


def restart_reason(variant: "Variant", cfg) -> Optional[str]:
    """launcher.max_restarts where the ranks are not started by torch's elastic agent: a result that says so."""
    launcher = getattr(cfg, "launcher", None)
    if launcher is None or not launcher.max_restarts or variant.rank_starter == Variant.rank_starter:
        return None
    return (f"launcher.max_restarts={launcher.max_restarts}: the {variant.name} adapter's ranks are started by its "
            f"own launcher ({variant.rank_starter.rsplit(':', 1)[-1]}), not torch's elastic agent that restarts them")


def compile_reason(variant: "Variant", cfg) -> Optional[str]:
    """run.compile on a strategy that does not wire torch.compile: a result that says so."""
    if getattr(cfg.run, "compile", False) and not variant.abilities().compiles:
        return f"run.compile: the {variant.name} adapter does not apply torch.compile yet (its abilities)"
    return None


FLOAT8_MIN_CAPABILITY = (8, 9)   # float8 tensor cores: Ada (8.9), Hopper (9.0) and later


def float8_reason(variant: "Variant", cfg, device_type: str, capability: Optional[tuple] = None) -> Optional[str]:
    """Why run.float8 cannot run here, or None: the strategy wires it, bf16 around the float8
    matmuls (torchtitan's recipe), a family whose matmuls are nn.Linear layers (Family.linear_layers:
    transformers' GPT-2 has Conv1D, vision models convolutions), torchao installed, float8 tensor cores on a GPU
    (`capability`: the smallest visible GPU's; on CPU torch._scaled_mm runs, for tests, not speed)."""
    import importlib.util
    if not getattr(cfg.run, "float8", False):
        return None
    if not variant.abilities().float8:
        return f"run.float8: the {variant.name} adapter does not apply float8 training (its abilities)"
    if cfg.run.precision != "bf16":
        return (f"run.float8 runs bf16 around the float8 matmuls (torchtitan's recipe): run.precision is "
                f"{cfg.run.precision}; set run.precision=bf16")
    from ddlbench.models.family import of_config
    if not of_config(cfg.model).linear_layers:
        return (f"run.float8 converts nn.Linear layers: {cfg.model.name} has none to convert (transformers' GPT-2 "
                "uses Conv1D, vision models convolutions); use a Llama-like model (llama, qwen3, ...)")
    if importlib.util.find_spec("torchao") is None:
        return "run.float8 needs torchao (pip install torchao)"
    if device_type == "cuda" and capability is not None and tuple(capability) < FLOAT8_MIN_CAPABILITY:
        return (f"run.float8 needs float8 tensor cores (compute capability >= 8.9: Ada, Hopper and later); this GPU "
                f"is {capability[0]}.{capability[1]}")
    return None


@dataclass(frozen=True)
class Abilities:
    """What the harness asks of a variant (Variant.abilities), in one place instead of name lists."""
    compiles: bool = False             # applies run.compile (parallelize.apply_compile, or its own API)
    float8: bool = False               # applies run.float8 (parallelize.apply_float8) before wrapping
    builds_on_meta: bool = False       # shards its parameters (FSDP2) before they hold a value: the model is
                                       # built on the meta device, each rank's shard materialised after
    shards_model_state: bool = False   # a rank keeps 1/W of some model state (what tracing it needs)
    own_collectives: bool = False      # its collectives bypass c10d, which the network model prices
    fake_group: Optional[str] = None   # why one step cannot run for rank 0 alone over torch's fake process
                                       # group (ddlbench/project/collectives.py), or None
    settles: dict = field(default_factory=dict)   # settings left `auto` it needs at one value, which
                                                  # validation sets: {'model.attention': 'sdpa'}
    step: Optional[StepRules] = None   # the predictor's shape of its step (ddlbench/estimate/scale.py);
                                       # None: no schedule rules for it yet
    checkpoints: tuple = ()            # run.checkpoint modes it saves with (ddlbench/adapters/checkpoint.py):
                                       # ("sync", "async"); (): it does not save yet


class Variant:
    """One framework variant: its options (validated), its parallel shape, what it cannot run,
    its taxonomy, its cost model, the launcher it needs. Subclasses override what differs."""

    name: ClassVar[str] = "base"
    Options: ClassVar[type[BaseModel]] = NoOptions
    # the per-rank half, "module:Class" under ddlbench.adapters, imported only on a rank
    strategy: ClassVar[str] = ""
    # how the ranks are started, on one machine and in a Slurm step (ddlbench/launch/starters.py):
    # "module:Class", imported by the launcher only
    rank_starter: ClassVar[str] = "ddlbench.launch.starters:Elastic"
    # modules the local launcher imports once before it forks CPU ranks (only modules that merely
    # import: no threads, no device work at import)
    preload_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: BaseModel):
        self.options = options

    def strategy_class(self) -> type:
        return load(self.strategy)

    def starter(self):
        """The object that starts this variant's ranks (ddlbench/launch/starters.py)."""
        return load(self.rank_starter)()

    def parallel_shape(self, cfg) -> dict:
        """Keyword arguments for ddlbench.settings.dims.resolve_dims: the tp, pp, dp_shard (and pipeline
        n_microbatches) this variant uses; data parallelism (dp_replicate) takes the rest."""
        return {}

    def check_config(self, cfg, dims: "ParallelDims") -> None:
        """Raise ConfigError for combinations this framework cannot take."""

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        """Why this variant cannot run here (missing package, device, precision, run.compile,
        run.float8), or None."""
        return (compile_reason(self, cfg) or checkpoint_reason(self, cfg, device_type) or restart_reason(self, cfg)
                or float8_reason(self, cfg, device_type, gpu_capability(device_type)))

    def taxonomy(self) -> dict:
        """Labels from the survey's taxonomy, shown in the report: parallelism (data, pipeline,
        tensor, hybrid), synchronisation (sync, periodic, stale, async), communication pattern,
        sharding, and compression of what is communicated."""
        return taxonomy_labels(parallelism="data", sync="sync", pattern="all-reduce")

    def grad_reduce_dtype(self, precision: str) -> str:
        """The dtype in which gradients cross the network at this run precision (a parity field:
        at bf16 DeepSpeed reduces in bf16 by default, DDP/FSDP2/Horovod in fp32)."""
        return "fp32"

    def ac_policy(self) -> str:
        """The run's activation checkpointing policy (ddlbench/models/checkpointing.py): none, full,
        selective_layer:K or selective_op."""
        from ddlbench.models.checkpointing import normalize
        return normalize(getattr(self.options, "activation_checkpointing", False))

    def launch_env(self) -> dict:
        """Environment variables the framework reads at start-up (set by the launcher)."""
        return {}

    def dry_run_info(self, cfg, dims: "ParallelDims") -> dict:
        """What `run.dry_run=true` prints beyond the dims (one CPU process, no process group)."""
        return {}

    def cost_model(self, dims: "ParallelDims", model: "ModelProfile", precision: str,
                   per_node: Optional[int] = None) -> Optional["CostModel"]:
        """What this variant holds and sends per optimizer step on `dims` (ddlbench.adapters.cost):
        what is sharded and over which ranks, its buffers, its collectives (per micro-batch where
        the framework communicates per micro-batch), its pipeline bubble. `per_node`: ranks per
        node where the variant's groups follow the nodes. None = no cost model (bench advise
        then prunes the variant, saying so)."""
        return None

    def advise_options(self, devices: int) -> list[dict]:
        """The option edits `bench advise` tries on `devices` ranks (its ways of splitting them:
        tp sizes, pipeline depths, shard-group sizes); [{}] = the variant as is."""
        return [{}]

    def abilities(self) -> Abilities:
        """What the harness asks of this variant, read from here everywhere and never from its name:
        what it wires, how a fake-group trace builds it, what `auto` settings it needs, the shape of
        its step for the predictor."""
        return Abilities()

    def analytic_comm(self, dims: "ParallelDims", precision: str, params: int,
                      per_node: Optional[int] = None) -> Optional["AnalyticComm"]:
        """What a run sends per step (payload per collective kind in units of Psi, the code path it
        follows, the paper's figure); None where there is no simple formula."""
        return None


def payload_psi(variant: Variant, dims: "ParallelDims", precision: str, params: int,
                per_node: Optional[int] = None) -> Optional[dict]:
    """A run's data-parallel payload per step, {kind: units of Psi}, from the variant's cost model
    (the one source for advise's prices and the record's analytic volume); None without one."""
    cost = variant.cost_model(dims, params_only(params), precision, per_node)
    return None if cost is None else cost.payload_psi()


def params_only(params: int):
    """A ModelProfile that knows the parameter count only: enough for what a cost model says about
    communication and model state (not activations)."""
    from ddlbench.adapters.cost import ModelProfile
    return ModelProfile(params=params or 0, largest_block_params=0, blocks=1, activation_bytes_per_sample=0,
                        checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0)


def model_state_theory(variant: Variant, dims: "ParallelDims", precision: str, params: int, optimizer: str,
                       momentum: float = 0.0) -> Optional[int]:
    """model_state_bytes_per_rank_theory: parameters + gradients + optimizer state on the busiest
    rank, from the variant's cost model (the one statement of what the framework keeps, which advise's
    memory estimate uses too); None without one."""
    cost = variant.cost_model(dims, params_only(params), precision, None)
    return None if cost is None else int(round(sum(cost.state_bytes(optimizer, momentum).values())))
