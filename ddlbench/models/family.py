"""The model-family contract: everything ddlbench knows about one family of models, in one file
per family (ddlbench/models/families/<name>.py exports `FAMILY`), the idea of torchtitan's
TrainSpec sized to us. A config names its family (`model.family`, or `kind: vision` for the
torchvision family); nothing else in ddlbench tests a family's name, class names or attributes:
building (random init, nothing downloaded), the repeated blocks (activation checkpointing,
per-block compile, FSDP units), the pipeline pieces, the tensor-parallel plan, the experts (expert
parallelism, router statistics) and the analytic FLOP count are all asked of the family.
docs/adding-a-model.md is the checklist; tests/test_families.py holds every family to it.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from ddlbench.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class TensorParallelPlan:
    """A Megatron-style plan for one block class (column-wise, then row-wise layers)."""
    block_class: str                             # the class name of the block it applies to
    apply: Callable[[nn.Module, object], None]   # (block, 1-D tp DeviceMesh): parallelised in place
    split_layers: dict[str, bool]                # layers it shards (as built) -> bias sharded too
    description: dict[str, str]                  # for the record: layer -> ParallelStyle
    # Megatron-style sequence parallelism (tensor_parallel's sequence_parallel option), where the
    # family has it: the block plan with it, and (model, its blocks in order, mesh) -> description
    # for the model around them (where the sequence is cut and gathered); None: not offered
    sequence_parallel: Optional[Callable[[nn.Module, object], None]] = None
    sp_model: Optional[Callable[..., dict]] = None     # (net, layers, mesh, loss_parallel)


@dataclass(frozen=True)
class ExpertsPlan:
    """Where a Mixture-of-Experts block keeps its router and experts. The experts module is
    transformers' layout (ddlbench/models/moe.py): 3-D `gate_up_proj` [E, 2I, H] and `down_proj`
    [E, H, I], forward(hidden [N, H], top_k_index [N, k], top_k_weights [N, k]); the router returns
    (logits, top-k weights, top-k indices)."""
    moe_block: Callable[[nn.Module], Optional[nn.Module]]   # a block -> its MoE layer, None where dense
    experts_attr: str = "experts"
    router_attr: str = "gate"


@dataclass(frozen=True)
class Family:
    name: str
    kind: str                                              # language | vision
    spec: Callable                                         # (model cfg, device type) -> ModelSpec
    modules: Callable[[object], tuple[str, ...]]           # model cfg -> libraries a launcher preloads
    blocks: Callable[[nn.Module], list[nn.Module]]         # the wrapped net -> its repeated blocks
    pieces: Callable[[nn.Module], list[nn.Module]]         # the wrapped net -> ordered pipeline pieces
    # model keys this family needs / may have (the rest of the family-specific keys must be unset)
    required_keys: tuple[str, ...] = ()
    optional_keys: tuple[str, ...] = ()
    check: Callable[[object], list[str]] = field(default=lambda mc: [])   # more reasons a config is wrong
    tensor_parallel: Optional[TensorParallelPlan] = None
    tp_widths: Callable[[object], dict[str, int]] = field(default=lambda mc: {})  # what tp must divide
    experts: Optional[ExpertsPlan] = None                  # None: a dense family
    linear_layers: bool = False                            # every matmul an nn.Linear (float8 converts them)
    sequence_split: bool = False                           # a dense rotary decoder whose position ids carry a
                                                           # sequence part's offsets: context and Ulysses parallelism cut it
    # (model cfg, vocabulary rows) -> analytic training FLOPs per token {"total", "parts", "convention"};
    # None: counted only (torch's flop counter)
    analytic_flops: Optional[Callable[[object, int], dict]] = None
    # every block the same at this config after the first leading_blocks (no alternating kinds): the memory
    # profile (ddlbench/estimate/profile.py) measures those and 3 more and scales to n_layer; False: every block
    uniform_blocks: Callable[[object], bool] = field(default=lambda mc: False)
    leading_blocks: Callable[[object], int] = field(default=lambda mc: 0)    # DeepSeek-V3: its dense first layers
    # the LM head shares the input embedding's weight (loss parallelism cannot shard one without the other)
    tied_head: Callable[[object], bool] = field(default=lambda mc: bool(getattr(mc, "tie_embeddings", False)))


# the model keys some family owns (ddlbench/settings/schema.py LanguageModelCfg); a family names those it uses
FAMILY_KEYS = ("n_kv_head", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings", "head_dim",
               "moe", "activation", "mla", "sliding_window")


def names() -> list[str]:
    """Every family: one module per family under ddlbench/models/families/."""
    from ddlbench.models import families
    return sorted(m.name for m in pkgutil.iter_modules(families.__path__) if not m.name.startswith("_"))


def get(name: str) -> Family:
    if name not in names():
        raise ConfigError(f"model.family '{name}' is not a model family (valid: {', '.join(names())})")
    return importlib.import_module(f"ddlbench.models.families.{name}").FAMILY


def of_config(model_cfg) -> Family:
    """The family of a model config: `model.family`, or torchvision for `kind: vision`."""
    return get("torchvision" if model_cfg.kind == "vision" else model_cfg.family)


def key_errors(family: Family, values: dict) -> list[str]:
    """Family-specific keys set that the family does not use, or needed and unset."""
    allowed = set(family.required_keys) | set(family.optional_keys)
    unused = sorted(k for k in FAMILY_KEYS if k not in allowed and values.get(k) not in (None, "auto"))
    missing = [k for k in family.required_keys if values.get(k) is None]
    errors = [f"{', '.join(unused)}: not a key of family {family.name}"] if unused else []
    if missing:
        errors.append(f"family {family.name} needs model.{', model.'.join(missing)}")
    return errors
