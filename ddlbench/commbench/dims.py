"""commbench across a cluster's two dimensions (devices within a node, nodes across the switch):
the flat ring beside the hierarchical all-reduce, and an α-β fit per dimension.

Kinds (ranks grouped by host: every host the same number of ranks, at least 2 hosts):
    all_reduce_node   an all-reduce within each node, every node at once: the node dimension
    all_reduce_cross  an all-reduce among the i-th ranks of every node, every i at once: the
                      inter-node dimension as the hierarchical algorithm loads it (a node's
                      devices share its uplink)
    all_reduce_hier   reduce-scatter within the node, all-reduce of the shard across nodes,
                      all-gather within the node: what FSDP2's hybrid sharding and NCCL's
                      hierarchy do, beside the flat ring (`all_reduce` over all ranks)
`all_reduce_node` is fitted with p = ranks per node and `all_reduce_cross` with p = nodes
(ddlbench.network.fit): bandwidths per device, the network model's terms, so they compare with
the cluster's described rates ($DDLBENCH_NETWORK) dimension by dimension.
"""
from __future__ import annotations

from ddlbench.comm.topology import cross_groups, node_groups
from ddlbench.errors import ConfigError

DIM_KINDS = ("all_reduce_node", "all_reduce_cross", "all_reduce_hier")
DIMENSION_OF = {"all_reduce_node": "node", "all_reduce_cross": "link"}


def host_groups(hosts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """(node groups: each host's ranks, hosts in order of first appearance; cross groups: the i-th
    rank of every host, i = 0, 1, ...), as ddlbench.comm.topology groups them for DASO and HSDP."""
    counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
    if len(counts) < 2 or len(set(counts.values())) != 1 or min(counts.values()) < 2:
        raise ConfigError(f"commbench {', '.join(DIM_KINDS)}: need >= 2 hosts with the same number (>= 2) of ranks "
                          f"each; got {', '.join(f'{h}: {n}' for h, n in counts.items())}")
    nodes = node_groups(hosts)
    return nodes, cross_groups(nodes)


def group_size(kind: str, per_node: int, nodes: int) -> int:
    return {"all_reduce_node": per_node, "all_reduce_cross": nodes}.get(kind, per_node * nodes)


def make_groups(hosts: list[str]) -> dict:
    """This rank's node and cross process groups (every rank creates every group, in one order)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    nodes, cross = host_groups(hosts)
    mine = {}
    for name, groups in (("node", nodes), ("cross", cross)):
        for ranks in groups:
            g = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = g
    return {**mine, "per_node": len(nodes[0]), "nodes": len(nodes)}


def group_op(kind: str, n: int, groups: dict, device):
    """A closure running one `kind` on a full buffer of n float32 elements (n divisible by the
    ranks per node)."""
    import torch
    import torch.distributed as dist

    full = torch.ones(n, device=device)
    if kind == "all_reduce_node":
        return lambda: dist.all_reduce(full, group=groups["node"])
    if kind == "all_reduce_cross":
        return lambda: dist.all_reduce(full, group=groups["cross"])
    shard = torch.ones(n // groups["per_node"], device=device)

    def hierarchical():
        dist.reduce_scatter_tensor(shard, full, group=groups["node"])
        dist.all_reduce(shard, group=groups["cross"])
        dist.all_gather_into_tensor(full, shard, group=groups["node"])
    return hierarchical


def dimension_fits(rows: list[dict], per_node: int, nodes: int, backend: str, described: list[dict] | None) -> dict:
    """{dimension: fit} from the all_reduce_node and all_reduce_cross rows; beside each fit the
    bandwidth the network description gives that dimension and the fit's ratio to it."""
    from ddlbench.network.fit import fit_alpha_beta

    by_name = {d["name"]: d for d in described or []}
    out = {}
    for kind, dim in DIMENSION_OF.items():
        pts = [(r["bytes"], r["time_s"]) for r in rows if r["kind"] == kind]
        if len({b for b, _ in pts}) < 2:
            continue
        try:
            fit = fit_alpha_beta(pts, "all_reduce", group_size(kind, per_node, nodes), backend)
        except ValueError as exc:
            out[dim] = {"kind": kind, "error": str(exc)}
            continue
        fit = {**fit, "kind": kind}
        if dim in by_name:
            configured = by_name[dim]["bandwidth_GBps"] * 1e9
            fit.update(described_bandwidth_Bps=configured, fit_over_described=fit["bandwidth_Bps"] / configured)
        out[dim] = fit
    return out
