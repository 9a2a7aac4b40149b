"""Expert parallelism's dispatch priced per dispatcher and routing (ddlbench/estimate/dispatch.py), by hand."""
from __future__ import annotations

import json

import pytest

from ddlbench.errors import ConfigError
from ddlbench.estimate import dispatch
from ddlbench.network.model import Dimension, all_to_all

NVLINK = Dimension("nvlink", 8, 400e9, 2e-6)
IB = Dimension("leaf", 32, 50e9, 5e-6)


def test_units_a_token_reaches_by_hand():
    # NeMo's balanced gate: token t takes experts 8t .. 8t + 7. DeepSeek-V3 at EP 64 keeps 4 a rank: always
    # two neighbouring ranks, on one node of 8 ranks (32 experts)
    assert dispatch.units_reached(256, 8, 64, "balanced") == 2.0
    assert dispatch.units_reached(256, 8, 8, "balanced") == 1.0
    # Kimi K2 at EP 32: 12 experts a rank; the first experts 0, 8, 16 (mod 12: 0, 8, 4) reach 1, 2, 1 ranks
    assert dispatch.units_reached(384, 8, 32, "balanced") == pytest.approx(4 / 3)
    # a learned router, uniform: 2 of 8 experts, 4 ranks of 2: a rank missed with C(6,2)/C(8,2) = 15/28
    assert dispatch.units_reached(8, 2, 4, "uniform") == pytest.approx(4 * 13 / 28)
    assert dispatch.units_reached(8, 2, 1, "uniform") == 1.0
    with pytest.raises(ValueError, match="do not divide"):
        dispatch.units_reached(10, 2, 4, "uniform")
    with pytest.raises(ValueError, match="routing must be"):
        dispatch.units_reached(8, 2, 4, "random")


def test_copies_crossing_each_dimension_by_hand():
    # 64 ranks as 8 per node x 8 nodes, top-8 of 256: an all_to_all sends every (token, expert) copy,
    # 63/64 of them off the rank, 56/64 off the node
    assert dispatch.copies_crossing([8, 8], 256, 8, "all_to_all", "uniform") == pytest.approx([8 * 63 / 64, 8 * 56 / 64])
    # DeepEP under the balanced gate: 2 ranks reached (63/64 of them another rank's), 1 node (7/8 another node's)
    assert dispatch.copies_crossing([8, 8], 256, 8, "deepep", "balanced") == pytest.approx([2 * 63 / 64, 7 / 8])
    # under a uniform router DeepEP still sends a token once per node: 8 nodes, each missed with C(224,8)/C(256,8)
    from math import comb
    nodes = 8 * (1 - comb(224, 8) / comb(256, 8))
    assert dispatch.copies_crossing([8, 8], 256, 8, "deepep", "uniform")[1] == pytest.approx(nodes * 7 / 8)
    assert dispatch.copies_crossing([8, 1], 128, 8, "deepep", "balanced") == pytest.approx([7 / 8, 0.0])
    with pytest.raises(ValueError, match="dispatch must be"):
        dispatch.copies_crossing([8], 8, 2, "nccl", "uniform")


def test_dispatch_seconds_by_hand_and_equal_to_the_all_to_all_model():
    spans = [(8, NVLINK), (8, IB)]
    token_bytes = 4096 * 7168 * 2.0
    # all_to_all: the network model's all_to_all of the top_k copies, exactly
    assert dispatch.seconds(token_bytes, spans, 256, 8, "all_to_all", "uniform") == pytest.approx(
        all_to_all(8 * token_bytes, spans), rel=1e-12)
    # DeepEP, balanced: 63 latencies (the larger one) and the slower of NVLink's 2 x 63/64 and IB's 7/8 copies
    hand = 63 * 5e-6 + max(2 * 63 / 64 * token_bytes / 400e9, 7 / 8 * token_bytes / 50e9)
    assert dispatch.seconds(token_bytes, spans, 256, 8, "deepep", "balanced") == pytest.approx(hand, rel=1e-12)
    assert dispatch.seconds(token_bytes, [(1, NVLINK)], 256, 8, "deepep", "balanced") == 0.0


def test_bench_project_prices_the_dispatcher_and_refuses_an_unknown_one(tmp_path):
    from ddlbench.project import spec_command
    args = ["model=moe_tiny", "framework=expert_parallel", "framework.options.ep=8", "network=ethernet_cpu_cluster",
            "hardware=H100", "run.precision=bf16", "local_batch=2", "mfu=0.4", "world_sizes=[16]",
            "model.seq_len=1024"]
    with pytest.raises(ConfigError, match="dispatch must be all_to_all or deepep"):
        spec_command.run([*args, "dispatch=nccl", f"out={tmp_path / 'x'}"])
    docs = {}
    for name, extra in (("plain", []), ("deepep", ["dispatch=deepep", "routing=balanced"])):
        spec_command.run([*args, *extra, f"out={tmp_path / name}"])
        docs[name] = json.loads((tmp_path / name / "projection.json").read_text())
    link = "all_to_all@rack"      # the links between the network's hosts of 4
    assert (docs["plain"]["dispatch"], docs["deepep"]["routing"]) == ("all_to_all", "balanced")
    a2a = [{k: v for k, v in d["rows"][0]["comm_by_kind_s"].items() if k.startswith("all_to_all")} for d in docs.values()]
    # ep 8 over 2 nodes of 4 (the network's): a token's 2 copies cross to the other node half the time (1 copy a token); the
    # balanced gate's 2 neighbouring experts share a node, sent once by DeepEP (half a copy): less all-to-all time
    assert set(a2a[0]) == set(a2a[1]) == {link} and a2a[1][link] < a2a[0][link]
