"""Parallel dimensions of a run: validated, pure, testable without a process group.

The world is a 5-D grid of sizes (pp, dp_replicate, dp_shard, cp, tp), laid out in that order
(MESH_ORDER: pp outermost, tp innermost; torchtitan's order). Any one size may be -1 = "whatever is left of
the world size". `dp` = dp_replicate x dp_shard is the number of data-parallel replicas of the model;
each takes global_batch / dp samples per optimizer step. `cp` ranks (context / sequence parallelism:
DeepSpeed-Ulysses) share one replica's samples, each holding its part of every sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

from pydantic import AfterValidator

from ddlbench.errors import ConfigError

# Mesh dimension names, outermost first (rank = ((pp * R + r) * S + s) * T + t): tensor
# parallel ranks are adjacent (same node, fastest link), pipeline stages furthest apart.
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _size(value: int) -> int:
    if value == 0 or value < -1:
        raise ValueError("must be >= 1, or -1 to infer it from the world size")
    return value


ParallelSize = Annotated[int, AfterValidator(_size)]   # for adapters' options: >= 1 or -1


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp: int              # data-parallel replicas = dp_replicate * dp_shard
    tp: int
    pp: int
    micro_batch: int     # samples per rank per forward/backward
    grad_accum: int      # micro-batches per optimizer step (pipeline: the schedule's micro-batches)
    global_batch: int    # samples per optimizer step, all data-parallel ranks together
    nodes: int = 1
    dp_replicate: int = 0  # 0 = dp (no separate shard dimension)
    dp_shard: int = 1
    cp: int = 1            # ranks that split each sequence (context / sequence parallelism)

    def __post_init__(self):
        if self.dp_replicate == 0:
            object.__setattr__(self, "dp_replicate", self.dp // self.dp_shard)

    @property
    def local_batch(self) -> int:
        """Samples one data-parallel rank consumes per optimizer step."""
        return self.micro_batch * self.grad_accum

    def mesh_shape(self) -> dict[str, int]:
        """Size per mesh dimension, outermost first; `cp` only where the run splits sequences."""
        sizes = {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "cp": self.cp,
                 "tp": self.tp}
        return {name: sizes[name] for name in MESH_ORDER if name != "cp" or self.cp != 1}

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's coordinate on every mesh dimension (row-major over MESH_ORDER)."""
        out = {}
        for name, size in reversed(list(self.mesh_shape().items())):
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name in MESH_ORDER if name in out}

    def dp_rank(self, rank: int) -> int:
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def as_dict(self) -> dict:
        return {"world_size": self.world_size, "nodes": self.nodes, "dp": self.dp,
                "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "cp": self.cp, "tp": self.tp,
                "pp": self.pp, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "global_batch": self.global_batch}


def infer_sizes(world_size: int, sizes: dict[str, int]) -> dict[str, int]:
    """Replace the one -1 in `sizes` so that the product is the world size; check the product."""
    if world_size < 1:
        raise ConfigError(f"launcher.nproc: world size must be >= 1, got {world_size}")
    bad = {k: v for k, v in sizes.items() if v == 0 or v < -1}
    if bad:
        raise ConfigError(f"parallel sizes must be >= 1 or -1 (infer): got {bad}")
    free = [k for k, v in sizes.items() if v == -1]
    if len(free) > 1:
        raise ConfigError(f"only one parallel size may be -1 (infer), got {', '.join(free)}")
    fixed = 1
    for v in sizes.values():
        if v != -1:
            fixed *= v
    shown = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != 1 or k in free)
    if free:
        if world_size % fixed:
            raise ConfigError(f"world size {world_size} is not divisible by {shown or 'the fixed sizes'} "
                              f"(fixed product {fixed})")
        return {**sizes, free[0]: world_size // fixed}
    if fixed != world_size:
        raise ConfigError(f"parallel sizes {shown} multiply to {fixed}, not the world size {world_size}")
    return dict(sizes)


def resolve_dims(world_size: int, global_batch: int, micro_batch: Optional[int],
                 tp: int = 1, pp: int = 1, nodes: int = 1, dp_shard: int = 1,
                 dp_replicate: int = -1, n_microbatches: Optional[int] = None, cp: int = 1) -> ParallelDims:
    """Derive the mesh sizes, dp and grad_accum; raise ConfigError naming the keys when they
    cannot fit. `n_microbatches` (pipelines) fixes grad_accum when run.micro_batch is unset."""
    if world_size < 1:
        raise ConfigError(f"launcher.nproc: world size must be >= 1, got {world_size}")
    if tp > 0 and pp > 0 and dp_shard > 0 and cp > 0 and dp_replicate == -1 and world_size % (tp * pp * dp_shard * cp):
        raise ConfigError(f"world size {world_size} is not divisible by tp*pp = {tp}*{pp}"
                          + (f" * dp_shard {dp_shard}" if dp_shard != 1 else "") + (f" * cp {cp}" if cp != 1 else ""))
    shape = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp, "pp": pp}
    sizes = infer_sizes(world_size, {**shape, "cp": cp} if cp != 1 else shape)
    dp = sizes["dp_replicate"] * sizes["dp_shard"]
    if global_batch % dp:
        raise ConfigError(f"run.global_batch {global_batch} is not divisible by dp={dp} ranks "
                          f"(valid: a multiple of {dp})")
    local = global_batch // dp
    if micro_batch is None:
        m = n_microbatches or 1
        if local % m:
            raise ConfigError(f"the local batch {local} (run.global_batch {global_batch} / dp {dp}) "
                              f"is not divisible by {m} micro-batches")
        micro_batch = local // m
    if global_batch % (dp * micro_batch):
        raise ConfigError(f"run.global_batch {global_batch} is not divisible by dp ranks x "
                          f"run.micro_batch = {dp} x {micro_batch} (valid: a multiple of "
                          f"{dp * micro_batch})")
    return ParallelDims(world_size=world_size, dp=dp, tp=sizes["tp"], pp=sizes["pp"],
                        micro_batch=micro_batch, grad_accum=local // micro_batch,
                        global_batch=global_batch, nodes=nodes,
                        dp_replicate=sizes["dp_replicate"], dp_shard=sizes["dp_shard"], cp=sizes.get("cp", 1))


def sequence_split_errors(mc, ranks: int, option: str, what: str, alone: str) -> list[str]:
    """Why `what` cannot cut this model's sequences over `ranks` (framework.options.`option`):
    fewer than 2 ranks (at 1 it is `alone`), or not a dense rotary decoder. Empty: it can."""
    if ranks < 2:
        return [f"framework.options.{option} = {ranks}: {what} needs 2 or more ranks per sequence (at 1 it is {alone})"]
    from ddlbench.models.family import get, names, of_config
    if not of_config(mc).sequence_split:      # the family says (Family.sequence_split)
        takes = ", ".join(n for n in names() if get(n).sequence_split)
        return [f"{what} here takes the dense rotary decoders ({takes}); {mc.name} is {getattr(mc, 'family', mc.kind)}"]
    return []


def model_fit_errors(dims: ParallelDims, model_cfg, stages: int, schedule: str | None = None) -> list[str]:
    """Why this model cannot be split as asked (empty list = it can): tp must divide the heads
    and widths that tensor parallelism shards; the pipeline needs one piece per stage; 1F1B-type
    schedules need at least as many micro-batches as pipeline ranks."""
    errors = []
    tp = dims.tp
    if tp > 1:
        from ddlbench.models.family import of_config
        fam = of_config(model_cfg)
        try:
            widths = fam.tp_widths(model_cfg)
            if fam.tensor_parallel is None:
                raise ValueError(f"model family {fam.name} has no tensor-parallel plan (tp = {tp} asked)")
        except ValueError as e:     # the family has no plan for this configuration
            widths = {}
            errors.append(str(e))
        for key, value in widths.items():
            if value % tp:
                errors.append(f"{key} = {value} is not divisible by tp = {tp}")
    if stages > 1:
        from ddlbench.models.pipeline import piece_count
        pieces = piece_count(model_cfg)
        if pieces < stages:
            errors.append(f"model {model_cfg.name} splits into {pieces} pipeline pieces, fewer than "
                          f"the {stages} stages (pp {dims.pp} x stages per rank {stages // dims.pp})")
    if schedule in ("1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble") and dims.pp > 1 \
            and dims.grad_accum < dims.pp:
        errors.append(f"schedule {schedule} needs micro-batches >= pipeline ranks: "
                      f"{dims.grad_accum} < pp {dims.pp}")
    return errors
