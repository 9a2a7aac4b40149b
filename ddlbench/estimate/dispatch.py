"""How many copies of a token an expert-parallel dispatch sends across each network dimension (pure;
by hand in tests/test_dispatch.py).

Two dispatchers:
- `all_to_all`: one copy per (token, chosen expert), an all_to_all_single over the ep ranks (ours:
  ddlbench/models/moe.py dispatch_combine; torchtitan's; Megatron's alltoall dispatcher): a token's
  top_k copies, each leaving a rank's group below dimension i with probability (p - below) / p.
- `deepep`: DeepEP's kernels (NeMo Automodel, Megatron's flex dispatcher): one copy per destination
  rank inside a node (NVLink), and one per destination node across nodes (RDMA to the same-index
  GPU of that node, which forwards it over NVLink), so a token crossing dimension i >= 1 goes once
  per node it reaches, however many of its experts live there.

Two routings, which decide how many ranks and nodes a token reaches:
- `uniform`: a learned router, balanced in expectation: top_k distinct experts drawn uniformly, so a
  group of E / u of the E experts is missed with probability C(E - E/u, k) / C(E, k).
- `balanced`: NeMo Automodel's FakeBalancedGate (its benchmarks' gate): token t's experts are
  (t k + j) mod E for j < k, consecutive experts, so they sit on one or two neighbouring ranks.

Experts sit in order on the ep ranks (E / ep each) and the ranks fill nodes innermost first
(ddlbench/estimate/step.spans). A rank is as likely to be any of the group's, so a unit a token
reaches lies outside the rank's group below dimension i with probability 1 - below / p.
"""
from __future__ import annotations

import math

DISPATCHERS = ("all_to_all", "deepep")
ROUTINGS = ("uniform", "balanced")


def units_reached(experts: int, top_k: int, units: int, routing: str) -> float:
    """Expected number of the `units` equal, ordered groups of experts (ranks, nodes) a token's top_k
    experts lie in."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    if units <= 1:
        return 1.0
    if experts % units:
        raise ValueError(f"{experts} experts do not divide into {units} equal groups")
    per = experts // units
    if routing == "balanced":
        period = experts // math.gcd(experts, top_k)      # token t and t + period choose the same experts
        return sum(len({(t * top_k + j) % experts // per for j in range(top_k)}) for t in range(period)) / period
    return units * (1 - math.comb(experts - per, top_k) / math.comb(experts, top_k))


def copies_crossing(sizes: list[int], experts: int, top_k: int, dispatcher: str, routing: str) -> list[float]:
    """Per dimension of the ep group's span (`sizes`: its members along each network dimension,
    innermost first), the copies of one token that cross that dimension's links, sent from one rank."""
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatch must be one of {DISPATCHERS}, got {dispatcher!r}")
    p = math.prod(sizes)
    out, below = [], 1
    for i, n in enumerate(sizes):
        if dispatcher == "all_to_all":
            reached = float(top_k)
        else:       # per rank inside the node, per node beyond it
            reached = units_reached(experts, top_k, p if i == 0 else p // sizes[0], routing)
        out.append(reached * (1 - below / p) if n > 1 and p > 1 else 0.0)
        below *= n
    return out


def seconds(token_bytes: float, spans: list, experts: int, top_k: int, dispatcher: str, routing: str) -> float:
    """One dispatch (or combine) of tokens totalling `token_bytes` (one copy each) from every rank over
    the ep group's `spans` ([(members, network Dimension)], innermost first): the copies crossing each
    dimension exchanged pairwise (ddlbench/network/model.exchange_time, as its all_to_all, which this
    equals for all_to_all)."""
    from ddlbench.network.model import exchange_time
    if token_bytes <= 0:
        return 0.0
    crossing = copies_crossing([n for n, _ in spans], experts, top_k, dispatcher, routing)
    return exchange_time([c * token_bytes for c in crossing], spans)
