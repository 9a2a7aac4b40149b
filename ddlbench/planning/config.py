"""Compose the Hydra config tree and validate it into a typed plan, before anything launches."""
from __future__ import annotations

import difflib
import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from ddlbench.errors import ConfigError
from ddlbench.settings.datacheck import check_data
from ddlbench.settings.dims import ParallelDims, resolve_dims
from ddlbench.settings.schema import BenchCfg

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("framework", "model", "data", "optim", "launcher", "logger", "hardware", "run",
          "experiment", "debug")


@dataclass(frozen=True)
class Plan:
    """Everything a launcher needs: the validated config, its plain form, the dims, the
    framework variant (ddlbench/adapters/variant.py: pure, its strategy is built on the ranks)."""
    cfg: BenchCfg
    raw: dict[str, Any]
    dims: ParallelDims
    variant: Any   # a ddlbench.adapters.variant.Variant holding the validated options
    choices: dict = field(default_factory=dict)   # decisions made here, for the record (micro_batch_auto)

    @property
    def options(self) -> Any:
        return self.variant.options


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _precheck(overrides: list[str], conf_dir: Path) -> None:
    """Name an unknown group option the way a user thinks about it, with the valid choices."""
    for ov in overrides:
        m = re.fullmatch(r"[+~]{0,2}([\w/.@-]+)=(.*)", ov)
        if not m:
            if not re.fullmatch(r"~[\w./]+", ov):
                raise ConfigError(f"cannot parse override '{ov}' (expected key=value)")
            continue
        group, value = m.group(1), m.group(2)
        if group in GROUPS and value not in ("null", "") and "," not in value:
            choices = group_options(group, conf_dir)
            if value not in choices:
                close = difflib.get_close_matches(value, choices, n=1)
                hint = f" did you mean '{close[0]}'?" if close else ""
                raise ConfigError(f"unknown {group} '{value}';{hint} available: {', '.join(choices)}")


def _hydra_message(exc: Exception) -> str:
    text = str(exc).strip()
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        return f"unknown config key '{m.group(1)}' (misspelt? use +{m.group(1)}=... only for new keys)"
    m = re.search(r"Missing mandatory value: [\w.]+\s+full_key: ([\w.]+)", text)
    if m:
        return f"{m.group(1)} is required: set {m.group(1)}=..."
    m = re.search(r"Key '([^']+)' is not in struct", text)
    if m:
        return f"unknown config key '{m.group(1)}'"
    return text.splitlines()[0] if text else type(exc).__name__


def compose_raw(overrides: list[str], conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """Hydra compose (no working-dir change, no logging setup) -> resolved plain dict (a copy of this
    process's earlier answer for the same overrides, config files and environment: one composition
    costs ~0.13 CPU-s, and `bench project published=`, sweeps and advise compose the same cells again)."""
    import copy

    where = (str(conf_dir), _conf_signature(conf_dir), frozenset(os.environ.items()))   # what a composition reads
    key = (tuple(overrides), *where)
    if key not in _COMPOSED:
        _COMPOSED[key] = _compose(list(overrides), conf_dir, where)
    return copy.deepcopy(_COMPOSED[key])


_COMPOSED: dict[tuple, dict[str, Any]] = {}


def _conf_signature(conf_dir: Path) -> tuple[int, int]:
    """(files, newest modification) of the config tree: an edited or added file is a new composition."""
    stamps = [f.stat().st_mtime_ns for f in Path(conf_dir).rglob("*.yaml")]
    return len(stamps), max(stamps, default=0)


def _compose(overrides: list[str], conf_dir: Path, where: tuple) -> dict[str, Any]:
    """Hydra's composition in two parts, as Hydra itself runs it: the defaults tree from the group choices
    (`model=llama_8b`: composed once a process for each set of choices, the costly part), then the value
    overrides (`model.n_layer=126`, `+key=v`, `~key`) applied to a copy by Hydra's own
    ConfigLoaderImpl._apply_overrides_to_config, in their order. An override of Hydra's own node, or one that
    deletes a group's choice (`~model`), composes everything the plain way. `where`: the config tree and
    environment the composition reads (compose_raw's key without the overrides)."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _precheck(overrides, conf_dir)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        if any(o.key_or_group.split("/")[0].split(".")[0] == "hydra"
               or (o.is_delete() and (conf_dir / o.key_or_group).is_dir()) for o in parsed):
            return OmegaConf.to_container(_compose_tree(tuple(overrides), conf_dir), resolve=True,
                                          throw_on_missing=True)  # type: ignore[return-value]
        is_group = [_is_group(o, conf_dir) for o in parsed]
        groups = tuple(o.input_line for o, g in zip(parsed, is_group) if g)
        values = [o for o, g in zip(parsed, is_group) if not g]
        key = (groups, *where)
        if key not in _TREES:
            _TREES[key] = _compose_tree(groups, conf_dir)
        if not values:
            return OmegaConf.to_container(_TREES[key], resolve=True, throw_on_missing=True)  # type: ignore
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        cfg = copy.deepcopy(_TREES[key])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_hydra_message(exc)) from None


_TREES: dict[tuple, Any] = {}


def _is_group(override, conf_dir: Path) -> bool:
    """Hydra's own test (defaults_list.Overrides): a group override names a config group and sets no dict."""
    return ((conf_dir / override.key_or_group).is_dir()
            and not isinstance(override.value(), dict))


def _compose_tree(overrides: tuple, conf_dir: Path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir), job_name="bench"):
        return compose(config_name="config", overrides=list(overrides))


EP_HINT = (" (this framework has no expert parallelism: framework=expert_parallel, expert_parallel_tp or "
           "deepspeed_moe with a Mixture-of-Experts model)")


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        # drop discriminator tags (model kind, data name) that pydantic puts after the group
        raw_loc = [str(p) for p in err["loc"]]
        loc = [p for i, p in enumerate(raw_loc) if not (i == 1 and raw_loc[0] in ("model", "data"))]
        key = ".".join(([prefix] if prefix else []) + loc)
        if err["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key" + (EP_HINT if key in ("framework.options.ep", "framework.options.ep_size")
                                                   else ""))
            continue
        got = err.get("input")
        got_s = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{key}: {err['msg']}{got_s}")
    return "; ".join(lines)


ADAPTER_PACKAGE = "ddlbench.adapters."


def load_variant_class(path: str) -> type:
    """Only the project's own adapters: a module under ddlbench.adapters and a subclass of
    Variant. Anything else (e.g. 'os:system') is refused before it is imported."""
    module, _, name = path.partition(":")
    if not module.startswith(ADAPTER_PACKAGE) or not module[len(ADAPTER_PACKAGE):].isidentifier():
        raise ConfigError(f"framework.adapter '{path}': only adapters in {ADAPTER_PACKAGE.rstrip('.')} "
                          "may be named (module:Class)")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"framework.adapter: cannot load '{path}': {exc}") from None
    from ddlbench.adapters.variant import Variant
    if not (isinstance(cls, type) and issubclass(cls, Variant)):
        raise ConfigError(f"framework.adapter '{path}' is not an adapter's Variant")
    return cls


def validate(raw: dict[str, Any], chosen: Optional[dict] = None) -> Plan:
    """`raw` stays what was asked (run.precision may be auto); `cfg` holds what will run.
    `chosen`: the launcher's run.micro_batch=auto choice (choices.json), which a rank re-validating
    config.json takes instead of profiling the model again (seconds per rank for a 1B model)."""
    concrete, batch_choice = _concrete(raw)
    choices = {"global_batch_auto": batch_choice} if batch_choice else {}
    try:
        cfg = BenchCfg.model_validate(concrete)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    variant_cls = load_variant_class(cfg.framework.adapter)
    try:
        variant = variant_cls(variant_cls.Options.model_validate(cfg.framework.options))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "framework.options")) from None
    cfg = _settle(cfg, variant)
    if cfg.launcher.name == "local" and cfg.launcher.nodes != 1:
        raise ConfigError(f"launcher.nodes {cfg.launcher.nodes}: the local launcher runs on one node "
                          "(use launcher=slurm across nodes)")
    if cfg.launcher.max_restarts and cfg.launcher.name != "local":
        raise ConfigError(f"launcher.max_restarts={cfg.launcher.max_restarts}: torch's elastic agent restarts the ranks "
                          "under the local launcher; under Slurm srun starts the ranks, and a requeued sweep cell "
                          "(scontrol requeue) runs again from its start, its earlier attempt archived")
    if cfg.run.micro_batch == "auto":
        plan = _auto_micro_batch(raw, cfg, variant, chosen)
        return Plan(cfg=plan.cfg, raw=raw, dims=plan.dims, variant=variant, choices={**choices, **plan.choices})
    dims = resolve_dims(cfg.launcher.nproc, cfg.run.global_batch, cfg.run.micro_batch,
                        nodes=cfg.launcher.nodes, **variant.parallel_shape(cfg))
    variant.check_config(cfg, dims)  # raises ConfigError for cross-key problems
    check_data(cfg)
    _check_checkpointing(cfg, variant)
    return Plan(cfg=cfg, raw=raw, dims=dims, variant=variant, choices=choices)


def _check_checkpointing(cfg: BenchCfg, variant) -> None:
    """A checkpointing policy that would checkpoint no block of the model (selective_layer:99 on a
    2-block model) is refused, not run as `none` under another name (issue 66)."""
    from ddlbench.models.checkpointing import chosen_blocks
    policy = variant.ac_policy()
    blocks = getattr(cfg.model, "n_layer", None)
    if policy != "none" and isinstance(blocks, int) and blocks > 0 and not chosen_blocks(policy, blocks):
        raise ConfigError(f"activation_checkpointing={policy} checkpoints none of {cfg.model.name}'s {blocks} blocks "
                          "(every K-th block, counting from 1): choose K <= n_layer, or none")


def _settle(cfg: BenchCfg, variant) -> BenchCfg:
    """Settings left `auto` that the framework needs at one value (its abilities' `settles`) set in the
    plan's cfg; `raw` keeps `auto`: framework=context_parallel runs SDPA causal without being told."""
    for key, value in variant.abilities().settles.items():
        section, _, name = key.partition(".")
        part = getattr(cfg, section)
        if getattr(part, name, None) == "auto":
            cfg = cfg.model_copy(update={section: part.model_copy(update={name: value})})
    return cfg


def _auto_micro_batch(raw: dict[str, Any], cfg: BenchCfg, variant, chosen: Optional[dict] = None) -> Plan:
    """run.micro_batch=auto: the plan at the micro-batch ddlbench/planning/microbatch.py chooses; `raw`
    keeps 'auto' (what was asked), the plan's cfg the number, `choices` why."""
    from ddlbench.machine.device import planned_device
    from ddlbench.planning.microbatch import choose

    def plan_for(mb: int) -> Plan:
        at = cfg.model_copy(update={"run": cfg.run.model_copy(update={"micro_batch": mb})})
        dims = resolve_dims(at.launcher.nproc, at.run.global_batch, mb, nodes=at.launcher.nodes,
                            **variant.parallel_shape(at))
        variant.check_config(at, dims)
        return Plan(cfg=at, raw=raw, dims=dims, variant=variant)

    if chosen:
        mb, why = int(chosen["chosen"]), chosen
    else:
        mb, why = choose(plan_for, cfg, planned_device(cfg.run.device))
    plan = plan_for(mb)
    check_data(plan.cfg)
    return Plan(cfg=plan.cfg, raw=raw, dims=plan.dims, variant=variant, choices={"micro_batch_auto": why})


def _concrete(raw: dict[str, Any]) -> tuple[dict[str, Any], Optional[dict]]:
    """run.precision=auto and run.global_batch=auto replaced by what they mean on this machine
    (ddlbench.machine.device); the global batch's choice, for the record (None when it was given)."""
    run = raw.get("run")
    if not isinstance(run, dict):
        return raw, None
    from ddlbench.machine.device import planned_global_batch, planned_precision
    run, batch_choice = planned_global_batch(raw)
    if run.get("precision", "auto") == "auto":
        run = {**run, "precision": planned_precision(run)}
    return {**raw, "run": run}, batch_choice


def plan_from_overrides(overrides: list[str], conf_dir: Path = CONF_DIR) -> Plan:
    return validate(compose_raw(overrides, conf_dir))
