"""What one training step of a measured run does, in a form the network model can price:
compute seconds per device and the collectives with their payloads and scope.

Scope of a collective, from the group it ran in ('<ranks>@<nodes>' in result.json
`comm.per_step_bytes_by_group`): `world` (all ranks: DDP, FSDP, ZeRO, Horovod), `node` (the
ranks of one node: DASO's gradient all-reduce and broadcast), `across` (one rank per node:
DASO's parameter average). Data-parallel strategies only: with tensor or pipeline parallelism
the group sizes do not follow the world size in a way this model knows, so it refuses.

Messages: a kind's payload in a group is priced as `calls` collectives of bytes / calls each
(each pays the latency once, and a fit per message size prices each at its size):
`comm.per_step_calls_by_group`, else the kind's `per_step_calls` where it ran in one group and was
counted at the c10d dispatch (every call a collective on the wire); an adapter's own counter
(Horovod: one request per gradient, which its tensor fusion packs into buffers) gives one message.

Overlap: where the run recorded when each message was handed over during backward (`comm.issued`,
Horovod's background thread), the collective keeps that profile and the projection lets the link
drain it while backward goes on (ddlbench.project.projection.drained); every other collective is
priced as exposed (DDP's gradients of these models fit one bucket, all-reduced after backward).
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
    calls: float = 1.0  # messages per step the payload went in
    issued: tuple[tuple[float, float], ...] = ()   # (headroom_s, bytes) per message sent during backward


@dataclass(frozen=True)
class Workload:
    label: str
    world: int                  # ranks of the measured run
    per_device_batch: float
    step_s: float               # measured median step time
    collectives: tuple[Collective, ...]
    tokens_per_sample: int | None = None


def group_key(key: str) -> tuple[int, int]:
    """(ranks, nodes) of a result's group key '<ranks>@<nodes>'; a damaged one is said, not a traceback."""
    try:
        ranks, nodes = (int(x) for x in str(key).split("@"))
    except ValueError:
        raise ConfigError(f"damaged result record: communication group {key!r} is not <ranks>@<nodes>") from None
    return ranks, nodes


def scope_of(key: str, world: int) -> str | None:
    ranks, nodes = group_key(key)
    if ranks <= 1:
        return None                     # a group of one sends nothing
    if ranks == world:
        return "world"
    if nodes == 1:
        return "node"
    if nodes == ranks:
        return "across"
    raise ConfigError(f"a collective over {ranks} ranks on {nodes} nodes: no projection rule for it")


def messages(comm: dict) -> dict[str, dict[str, float]]:
    """{kind: {group key: calls per step}} of a result's `comm` (see the module's docstring)."""
    def per_step(c) -> float:      # fewer than one a step: one message every 1/c steps (DASO's cycles)
        return float(c) if c and c > 0 else 1.0
    by_group = comm.get("per_step_calls_by_group")
    if by_group is not None:
        return {k: {g: per_step(c) for g, c in v.items()} for k, v in by_group.items()}
    if comm.get("source") != "c10d_dispatch":
        return {}
    calls = comm.get("per_step_calls") or {}
    return {k: {g: per_step(calls.get(k))} for k, groups in (comm.get("per_step_bytes_by_group") or {}).items()
            if len(groups) == 1 for g in groups}


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
    calls = messages(comm)
    for kind, b in (comm.get("per_step_bytes") or {}).items():
        if kind in by_group:
            for key, gb in by_group[kind].items():
                scope = scope_of(key, world)
                if scope and gb > 0:
                    out.append(Collective(kind, float(gb), scope, group_size(key), group_key(key)[1],
                                          calls.get(kind, {}).get(key, 1.0)))
        elif b > 0 and world > 1:       # counted without groups (Horovod's own counter): world
            issued = tuple((float(h), float(n)) for h, n in (comm.get("issued") or {}).get(kind, []))
            out.append(Collective(kind, float(b), "world", world, int(par.get("nodes") or 1), issued=issued))
    fw = rec.get("framework") or {}
    label = fw.get("name", "?") + ("" if fw.get("variant") in (None, "default") else f":{fw['variant']}")
    return Workload(label=label, world=world, per_device_batch=par["global_batch"] / world,
                    step_s=float(rec["timing"]["step_time_s"]["median"]), collectives=tuple(out),
                    tokens_per_sample=(rec.get("model") or {}).get("tokens_per_sample"))



REPLAN_WORLD = 8


def replanned(rec: dict, work: Workload) -> tuple[Workload, str]:
    """A 1-rank run sent nothing: its configuration re-planned at REPLAN_WORLD ranks and one step of
    the framework's own code traced there (ddlbench/project/collectives.py), its collectives
    priced at every world size as the run's own would be (data-parallel payloads follow the
    parameters). Raises ConfigError where that cannot be done: never a projection with no
    communication."""
    from dataclasses import replace

    from ddlbench.project.collectives import trace_record
    try:
        got = trace_record(rec, REPLAN_WORLD)
    except ValueError as exc:
        raise ConfigError(f"a 1-rank run has no collectives to project from, and they cannot be re-planned: {exc}; "
                          "project a run of 2 or more ranks") from None
    if "error" in got:
        raise ConfigError(f"a 1-rank run has no collectives to project from; re-planning them at {REPLAN_WORLD} ranks "
                          f"failed: {got['error']}")
    out = []
    for kind, groups in got["by_group"].items():
        for key, b in groups.items():
            scope = scope_of(key, REPLAN_WORLD)
            if scope and b > 0:
                out.append(Collective(kind, float(b), scope, group_size(key), 1,
                                      float((got["calls_by_group"].get(kind) or {}).get(key, 1.0)) or 1.0))
    how = (f"re-planned: the run's configuration set up for rank 0 of {REPLAN_WORLD} ranks over torch's fake process "
           f"group, one step of {got['framework']} traced ({got['method']})")
    held = got.get("state_bytes")
    if held:
        how += (f"; rank 0 then held {held['params'] / 2**20:.1f} MiB of parameters and {held['optimizer'] / 2**20:.1f} MiB "
                f"of optimizer state (read from the framework's objects)")
    return replace(work, collectives=tuple(out)), how
