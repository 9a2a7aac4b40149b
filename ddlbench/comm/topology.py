"""Which ranks share a node: the layout node-aware strategies build their process groups on
(DASO's node and cross-node groups, FSDP2 hybrid sharding's shard and replicate dimensions) and
the collective counter splits intra- from inter-node traffic by.

A node is a host name: the ranks are grouped by the host they run on, in order of their first
rank, so the groups follow the nodes whatever order a launcher numbers ranks in (Slurm's block
or cyclic distribution). On one machine every rank has the same host, and a strategy that
emulates nodes (`ranks_per_node=2`) cuts that one host's ranks into consecutive blocks.
"""
from __future__ import annotations

import socket
from typing import Optional

from ddlbench.errors import ConfigError


def node_groups(hosts: list[str], per_node: Optional[int] = None) -> list[list[int]]:
    """Ranks grouped into nodes. `hosts[r]` is rank r's host. per_node None: one group per host
    (every host must run the same number of ranks); per_node k: the ranks in host order (each
    host's ranks together, hosts by their first rank) cut into blocks of k."""
    order: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        order.setdefault(host, []).append(rank)
    if per_node is None:
        sizes = {h: len(r) for h, r in order.items()}
        if len(set(sizes.values())) > 1:
            raise ConfigError(f"ranks per host differ ({sizes}): node groups need the same number of ranks on "
                              "every node")
        return list(order.values())
    if per_node < 1 or len(hosts) % per_node:
        raise ConfigError(f"ranks per node {per_node} does not divide the world size {len(hosts)}")
    flat = [r for ranks in order.values() for r in ranks]
    return [flat[i:i + per_node] for i in range(0, len(flat), per_node)]


def node_of(groups: list[list[int]]) -> list[int]:
    """Rank -> index of its node group."""
    out = [0] * sum(len(g) for g in groups)
    for i, group in enumerate(groups):
        for r in group:
            out[r] = i
    return out


def cross_groups(groups: list[list[int]]) -> list[list[int]]:
    """The i-th rank of every node, for each i: the groups that cross nodes (DASO's global
    groups, hybrid sharding's replicate dimension)."""
    return [list(ranks) for ranks in zip(*groups)]


def hosts_of(ctx) -> list[str]:
    """Every rank's host, in rank order: the RankContext's (exchanged when the process group
    formed), else gathered now (a collective: every rank calls it)."""
    return list(ctx.hosts) or gather_hosts()


def gather_hosts() -> list[str]:
    """Every rank's host name, in rank order (a collective: every rank calls it)."""
    import torch.distributed as dist
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts
