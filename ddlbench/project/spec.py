"""`bench project` from a specification: the rows of ddlbench/estimate/scale.py at every world
size, with the efficiency stated or calibrated on a measured point (see scale.py's docstring)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ddlbench.errors import ConfigError
from ddlbench.estimate.scale import Pricing, step_of


@dataclass(frozen=True)
class Spec:
    overrides: tuple[str, ...]      # what `bench run` would take: framework=, model=, run.precision=, ...
    local_batch: int                # samples per data-parallel rank per step
    peak_flops: float               # per device, at the run's precision
    ac: str = "none"                # added to the overrides (a configuration keeps its own)
    per_node: int = 8
    device_memory_bytes: float | None = None
    config: dict | None = None      # a run's whole configuration (its result.json) instead of overrides
    device: str = "cuda"            # the device type the model is profiled for
    keep: dict = field(default_factory=dict)   # with `config`: the run's model-parallel sizes {tp, pp, cp}
    ranks_per_core: int = 1         # a node's ranks sharing one processor (bench cluster on a small host)
    attention_efficiency: float | None = None   # the T x T attention matmuls' fraction of the peak (None: the rest's)
    ridge: float = 0.0              # peak FLOP/s over the memory's bytes/s: the other ops' bytes priced (0: folded in)
    kernels: str = "none"           # the other ops as eager mode runs them, fused between the matmuls, or folded in

    def attention_flops(self) -> float | None:
        return self.peak_flops * self.attention_efficiency if self.attention_efficiency else None


def plan_at(spec: Spec, world: int):
    """The configuration planned for `world` ranks with global batch dp x local_batch (weak
    scaling): the data-parallel degree the framework plans is found by planning each divisor of the
    world, largest first (the first that plans with that dp is the one)."""
    from ddlbench.planning.microbatch import divisors_descending
    plan_for = _config_planner(spec, world) if spec.config is not None else _override_planner(spec, world)
    first = None
    for dp in divisors_descending(world):
        try:
            plan = plan_for(dp * spec.local_batch)
        except ConfigError as exc:
            first = first or exc
            continue
        if plan.dims.dp == dp:
            return plan
    raise first or ConfigError(f"no data-parallel degree plans {world} ranks with local_batch={spec.local_batch}")


def _override_planner(spec: Spec, world: int):
    """global batch -> the plan of the specification's overrides at `world` ranks."""
    from ddlbench.planning.config import plan_from_overrides
    base = [*spec.overrides, f"launcher.nproc={world}"]
    if spec.ac != "none":
        base.append(f"framework.options.activation_checkpointing={spec.ac}")

    def plan_for(global_batch: int):
        try:
            return plan_from_overrides([*base, f"run.global_batch={global_batch}"])
        except ConfigError as exc:
            if "activation_checkpointing" in str(exc):
                raise ConfigError(f"ac={spec.ac}: this framework has no activation_checkpointing option ({exc})") from None
            raise
    return plan_for


def _config_planner(spec: Spec, world: int):
    """global batch -> a run's configuration re-planned for `world` ranks on one launcher (planning
    only). The model-parallel sizes the run had (`spec.keep`: tp, pp, cp) are kept and data
    parallelism takes the rest (tensor parallelism: FSDP2 over dp_shard; a pipeline, Ulysses:
    replicas)."""
    import copy

    from ddlbench.planning.config import validate
    raw = copy.deepcopy(spec.config)
    raw["launcher"].update(nproc=world, nodes=1, name="local")
    opts = raw["framework"].setdefault("options", {})
    for option, size, rest in (("tp", "tp", "dp_shard"), ("pp", "pp", "dp"), ("sp", "cp", None)):
        if option in opts and spec.keep.get(size, 1) > 1:
            opts[option] = spec.keep[size]
            if rest in opts:
                opts[rest] = -1

    def plan_for(global_batch: int):
        raw["run"]["global_batch"] = global_batch
        return validate(copy.deepcopy(raw))
    return plan_for


def tokens_per_sample(plan) -> int:
    """A language model's sequence; an image model's sample counts as one."""
    return int(getattr(plan.cfg.model, "seq_len", 0) or 1)


def _profile(plan, device: str):
    from ddlbench.estimate.profile import cached_profile
    return cached_profile(plan.cfg.model, plan.cfg.run.precision, device)[0]


def solve_efficiency(spec: Spec, pricing: Pricing, tokens_per_s: float, world: int) -> float:
    """The fraction of peak at which the simulated step at `world` devices gives `tokens_per_s` per
    device (bisection: the step only shortens as compute speeds up). ConfigError where even the
    peak cannot reach it."""
    plan = plan_at(spec, world)
    prof = _profile(plan, spec.device)
    tokens = plan.dims.global_batch * tokens_per_sample(plan)

    def rate(eff: float) -> float:
        s = step_of(plan, prof, pricing, spec.peak_flops * eff, plan.variant.ac_policy(), spec.per_node,
                    ranks_per_core=spec.ranks_per_core, attention_flops_per_s=spec.attention_flops(),
                    ridge=spec.ridge, kernels=spec.kernels)
        return tokens / s["step_s"] / world
    if rate(1.0) < tokens_per_s:
        raise ConfigError(f"calibrate: {tokens_per_s:g} tokens/s per device at {world} devices is faster than this "
                          f"model runs at 100% of the peak ({rate(1.0):,.0f}); check the peak or the figure")
    lo, hi = 1e-4, 1.0
    while hi - lo > 1e-9 * hi:      # ~30 halvings (each a simulated step: 1 s for a 128-micro-batch schedule)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < tokens_per_s else (lo, mid)
    return (lo + hi) / 2


@contextmanager
def cpu_threads(plan):
    """On a CPU, the pieces and the framework's step timed with the threads one rank of `plan` gets
    on this host, as a run of it here would (launch.local.threads_per_rank: the usable cores over its
    ranks, or launcher.threads_per_rank): a 2-rank plan on 2 cores, 1 each. Yields that number (None
    on a GPU: `plan` None); the framework's step, in a process of its own, takes it from
    OMP_NUM_THREADS."""
    import os

    import torch
    if plan is None:
        yield None
        return
    from ddlbench.launch.local import threads_per_rank
    threads, before, env = threads_per_rank(plan), torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


def timed_pieces(spec: Spec, world: int, repeats: int = 5, with_framework: bool = True,
                 framework_world: int | None = None) -> dict:
    """calibrate=pieces: the pieces of the plan at `world` timed on this host's device at the plan's
    micro-batch and precision (ddlbench/project/piece_timer.py): {'per_sample': [(f, b) per piece],
    'timed': {piece: (f, b)}, 'optimizer': {'optimizer_s_per_param', 'optimizer_step_s': {depth: s}} (the
    run's optimizer), 'framework': piece_timer.framework_factor's (the framework's own step at the plan's
    layout at `framework_world` ranks, default `world`, over a fake group against the bare model's; None
    without `with_framework`), 'device', 'micro_batch', 'efficiency': the model's FLOPs over the timed
    seconds, as a fraction of the peak}."""
    import torch

    from ddlbench.project.piece_timer import framework_factor, per_sample, time_pieces
    plan = plan_at(spec, world)
    prof = _profile(plan, spec.device)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = "fp32" if plan.cfg.run.precision == "auto" else plan.cfg.run.precision
    mb = plan.dims.micro_batch
    at = plan if framework_world in (None, world) else plan_at(spec, framework_world)
    with cpu_threads(at if device.type == "cpu" else None) as threads:
        timed = time_pieces(plan.cfg.model, precision, device, mb, repeats, optim_cfg=plan.cfg.optim)
        optimizer = {k: timed.pop(k) for k in ("optimizer_s_per_param", "optimizer_step_s", "optimizer_rule") if k in timed}
        if device.type == "cuda":
            torch.cuda.empty_cache()      # the framework's step below runs in a process of its own on this GPU
        framework = framework_factor(at, prof, timed, optimizer, device.type) if with_framework else None
    timed.pop("model_s")
    seconds = per_sample(prof, timed, mb)
    flops = 3 * sum(p.flops for p in prof.pieces)
    return {"per_sample": seconds, "timed": timed, "device": str(device), "cpu_threads": threads, "micro_batch": mb,
            "precision": precision,
            "optimizer": optimizer, "framework": framework,
            "efficiency": flops / sum(f + b for f, b in seconds) / spec.peak_flops}


def rows(spec: Spec, pricing: Pricing, world_sizes: list[int], efficiency: float,
         measured: list[tuple[float, float]] | None = None, optimizer_s_per_param: float | None = None) -> list[dict]:
    from ddlbench.estimate.memcheck import predicted
    from ddlbench.estimate.memory import RESERVED_OVER_ALLOCATED
    out = []
    for w in world_sizes:
        plan = plan_at(spec, w)
        prof = _profile(plan, spec.device)
        d = plan.dims
        s = step_of(plan, prof, pricing, spec.peak_flops * efficiency, plan.variant.ac_policy(), spec.per_node, measured,
                    optimizer_s_per_param, spec.ranks_per_core, attention_flops_per_s=spec.attention_flops(),
                    ridge=spec.ridge, kernels=spec.kernels)
        tokens = d.global_batch * tokens_per_sample(plan)
        model_flops = 3 * sum(p.flops for p in prof.pieces) * d.global_batch   # per step, no recompute
        try:
            mem = predicted(plan, prof, spec.per_node, spec.device)
        except ValueError:
            mem = None
        row = {"devices": w, "layout": s["layout"],
               "global_batch": d.global_batch, "step_s": s["step_s"], "compute_s": s["compute_s"],
               "optimizer_s": s.get("optimizer_s"),
               "exposed_comm_s": s["step_s"] - s["compute_s"], "exposed_by_kind_s": s["exposed"],
               "comm_by_kind_s": {k: v for k, v in s["comm_s"].items() if v > 0}, "tokens_per_s_per_device": tokens / s["step_s"] / w,
               "mfu": model_flops / s["step_s"] / w / spec.peak_flops,
               "memory_per_rank_bytes": mem["total"] if mem else None,
               # what the caching allocator would reserve for it (our H200 records' median ratio)
               "memory_reserved_per_rank_bytes": mem["total"] * RESERVED_OVER_ALLOCATED if mem else None,
               "memory_parts_bytes": {k: v for k, v in mem.items() if k not in ("total",)} if mem else None}
        if mem and spec.device_memory_bytes:
            row["fits"] = mem["total"] <= spec.device_memory_bytes
        out.append(row)
    return out
