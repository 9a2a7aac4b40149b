"""What one training step of a measured run does, in a form the network model can price:
compute seconds per device and the collectives with their payloads and scope.

Scope of a collective, from the group it ran in ('<ranks>@<nodes>' in result.json
`comm.per_step_bytes_by_group`): `world` (all ranks: DDP, FSDP, ZeRO, Horovod), `node` (the
ranks of one node: DASO's gradient all-reduce and broadcast), `across` (one rank per node:
DASO's parameter average). Data-parallel strategies only: with tensor or pipeline parallelism
the group sizes do not follow the world size in a way this model knows, so it refuses.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddlbench.errors import ConfigError
from ddlbench.metrics.comm import group_size


@dataclass(frozen=True)
class Collective:
    kind: str
    bytes: float      # payload per step
    scope: str        # world | node | across
    ranks: int        # group size in the measured run
    nodes: int = 1    # nodes that group spanned in the measured run


@dataclass(frozen=True)
class Workload:
    label: str
    world: int                  # ranks of the measured run
    per_device_batch: float
    step_s: float               # measured median step time
    collectives: tuple[Collective, ...]
    tokens_per_sample: int | None = None


def scope_of(key: str, world: int) -> str | None:
    ranks, nodes = (int(x) for x in str(key).split("@"))
    if ranks <= 1:
        return None                     # a group of one sends nothing
    if ranks == world:
        return "world"
    if nodes == 1:
        return "node"
    if nodes == ranks:
        return "across"
    raise ConfigError(f"a collective over {ranks} ranks on {nodes} nodes: no projection rule for it")


def from_record(rec: dict) -> Workload:
    if rec.get("status") != "ok":
        raise ConfigError(f"run {rec.get('run_id')} is {rec.get('status')}: only ok runs can be projected")
    par = rec.get("parallel") or {}
    if (par.get("tp") or 1) > 1 or (par.get("pp") or 1) > 1:
        raise ConfigError("projection covers data-parallel strategies (tp = pp = 1); this run uses "
                          f"tp={par.get('tp')} pp={par.get('pp')}")
    world = int(par["world_size"])
    comm = rec.get("comm") or {}
    if world > 1 and not comm.get("per_step_bytes_by_group") and not comm.get("per_step_bytes"):
        raise ConfigError("the result has no communication counts (comm) to project from")
    out = []
    by_group = comm.get("per_step_bytes_by_group") or {}
    for kind, b in (comm.get("per_step_bytes") or {}).items():
        if kind in by_group:
            for key, gb in by_group[kind].items():
                scope = scope_of(key, world)
                if scope and gb > 0:
                    out.append(Collective(kind, float(gb), scope, group_size(key), int(str(key).split("@")[1])))
        elif b > 0 and world > 1:       # counted without groups (Horovod's own counter): world
            out.append(Collective(kind, float(b), "world", world, int(par.get("nodes") or 1)))
    fw = rec.get("framework") or {}
    label = fw.get("name", "?") + ("" if fw.get("variant") in (None, "default") else f":{fw['variant']}")
    return Workload(label=label, world=world, per_device_batch=par["global_batch"] / world,
                    step_s=float(rec["timing"]["step_time_s"]["median"]), collectives=tuple(out),
                    tokens_per_sample=(rec.get("model") or {}).get("tokens_per_sample"))

