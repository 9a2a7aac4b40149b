"""The candidate grid: framework x parallel layout x micro-batch x activation checkpointing, at
one global batch. Every candidate is composed and validated exactly as `bench run` would
(ddlbench.planning.config.plan_from_overrides: dims, the adapter's check_config, the model's fit for tp/pp,
the schedule's micro-batch floor), then checked against the network's devices per node and the
framework's availability here; each pruned candidate keeps its reason."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ddlbench.errors import ConfigError
from ddlbench.estimate.memory import Layout

DEFAULT_FRAMEWORKS = ("ddp", "fsdp_full", "fsdp_grad_op", "fsdp_hybrid", "deepspeed_zero1", "deepspeed_zero2",
                      "deepspeed_zero3",
                      "horovod", "fairscale_oss", "tensor_parallel", "pipeline_1f1b", "pipeline_gpipe")


@dataclass
class Candidate:
    id: str
    framework: str
    overrides: list[str]
    layout: Optional[Layout] = None
    pruned: Optional[str] = None          # why it is not run (None = it is a candidate)
    plan: object = field(default=None, repr=False)
    cost: object = field(default=None, repr=False)   # its adapter's CostModel (ddlbench.adapters.cost)

    def label(self) -> str:
        if self.layout is None:     # invalid: the request as given
            asked = [o.split(".")[-1] for o in self.overrides if o.startswith(("framework.options.", "run.micro_batch"))]
            return " ".join([self.framework, *asked])
        lay = self.layout
        parts = [self.framework, f"dp{lay.dp}" + (f"(shard {lay.shard})" if lay.shard else "")]
        parts += [f"ep{lay.ep}"] if lay.ep > 1 else []
        parts += [f"tp{lay.tp}"] if lay.tp > 1 else []
        parts += [f"pp{lay.pp}"] if lay.pp > 1 else []
        parts += [f"mb{lay.micro_batch}x{lay.grad_accum}"] + (["ckpt"] if lay.checkpointing else [])
        return " ".join(parts)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _data_parallel(composed: dict, edits: dict, devices: int) -> int:
    """Data-parallel ranks of the composed config with these framework options (all the devices
    where it is invalid: its candidates then say why)."""
    import copy

    from ddlbench.planning.config import validate
    raw = copy.deepcopy(composed)
    raw["framework"].setdefault("options", {}).update(edits)
    try:
        return validate(raw).dims.dp
    except ConfigError:
        return devices


def enumerate_grid(model: str, devices: int, global_batch: int, frameworks=DEFAULT_FRAMEWORKS,
                   micro_batches: Optional[list[int]] = None, devices_per_node: Optional[int] = None,
                   extra: tuple[str, ...] = ()) -> list[Candidate]:
    """Every combination, validated; `extra`: overrides added to every candidate (run.*).
    Hydra composes once per framework; each combination edits that config and validates it."""
    import copy

    from ddlbench.launch.local import device_type
    from ddlbench.planning.config import compose_raw, validate

    out: list[Candidate] = []
    for fw in frameworks:
        base = [f"framework={fw}", f"model={model}", f"launcher.nproc={devices}", f"run.global_batch={global_batch}"]
        composed = compose_raw([*base, *extra])
        try:     # the variant's own ways of splitting the devices (Variant.advise_options)
            plan = validate(copy.deepcopy(composed))
            option_edits = plan.variant.advise_options(devices)
        except ConfigError:
            option_edits = [{}]          # invalid as given: its candidates say why
        for opts in option_edits:
            dp = _data_parallel(composed, opts, devices)
            local = global_batch // dp if global_batch % dp == 0 else None
            mbs = [m for m in (micro_batches or divisors(local or 1)) if local and local % m == 0] or [None]
            for m in mbs:
                for ckpt in (False, True):
                    edits = dict(opts) | ({"activation_checkpointing": True} if ckpt else {})
                    over = [*base, *(f"framework.options.{k}={str(v).lower()}" for k, v in edits.items()), *extra]
                    over += [f"run.micro_batch={m}"] if m else []
                    cand = Candidate(id=f"c{len(out):03d}", framework=fw, overrides=over)
                    out.append(cand)
                    raw = copy.deepcopy(composed)
                    raw["framework"].setdefault("options", {}).update(edits)
                    if m:
                        raw["run"]["micro_batch"] = m
                    try:
                        plan = validate(raw)
                    except ConfigError as exc:
                        if ckpt and "activation_checkpointing" in str(exc):
                            out.pop()              # not an option of this framework: not a candidate
                            continue
                        cand.pruned = f"invalid: {exc}"
                        continue
                    d = plan.dims
                    cand.plan = plan
                    cand.layout = Layout(fw, dp=d.dp, tp=d.tp, pp=d.pp, micro_batch=d.micro_batch,
                                         grad_accum=d.grad_accum, checkpointing=ckpt,
                                         ep=int(getattr(plan.variant.options, "ep", 1)), cp=d.cp)
                    if devices_per_node and d.tp > devices_per_node:
                        cand.pruned = f"topology: tp {d.tp} > {devices_per_node} devices per node"
                        continue
                    try:
                        reason = plan.variant.unsupported_reason(plan.cfg, device_type(plan.cfg))
                    except ConfigError as exc:
                        reason = str(exc)
                    if reason:
                        cand.pruned = f"unsupported: {reason}"
    return out
