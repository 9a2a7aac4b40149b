"""Node groups follow the hosts the ranks run on (ddlbench/comm/topology.py), by hand."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlbench.comm.topology import cross_groups, node_groups, node_of
from ddlbench.errors import ConfigError


def test_groups_follow_the_hosts_whatever_the_rank_order():
    # Slurm's block distribution (2 nodes x 2 ranks) and its cyclic one
    assert node_groups(["n1", "n1", "n2", "n2"]) == [[0, 1], [2, 3]]
    assert node_groups(["n1", "n2", "n1", "n2"]) == [[0, 2], [1, 3]]
    assert cross_groups([[0, 2], [1, 3]]) == [[0, 1], [2, 3]]
    assert node_of([[0, 2], [1, 3]]) == [0, 1, 0, 1]
    # hosts ordered by their first rank, not by name
    assert node_groups(["b", "a", "b", "a"]) == [[0, 2], [1, 3]]


def test_one_host_cut_into_emulated_nodes():
    assert node_groups(["h"] * 4) == [[0, 1, 2, 3]]
    assert node_groups(["h"] * 4, 2) == [[0, 1], [2, 3]]
    assert cross_groups([[0, 1], [2, 3]]) == [[0, 2], [1, 3]]
    # across hosts, blocks of the host-ordered ranks: 2 nodes x 4 ranks, cyclic, cut in 2s
    assert node_groups(["a", "b"] * 4, 2) == [[0, 2], [4, 6], [1, 3], [5, 7]]


def test_uneven_nodes_are_refused():
    with pytest.raises(ConfigError, match="ranks per host differ"):
        node_groups(["a", "a", "b"])
    with pytest.raises(ConfigError, match="does not divide the world size 4"):
        node_groups(["h"] * 4, 3)


def test_the_lost_node_is_the_same_from_both_sides_of_a_dead_link():
    from ddlbench.launch.liveness import lost_nodes
    hosts = ["n1", "n2", "n1", "n2"]
    # from n1 (its network up): both ranks on n2 unreachable -> n2
    assert lost_nodes(hosts, ["self", "unreachable", "up", "unreachable"], 0, True) == ["n2"]
    # from n2 (its own interface down): everything unreachable -> its own node
    assert lost_nodes(hosts, ["unreachable", "self", "unreachable", "up"], 1, False) == ["n2"]
    # a rank that exited on a reachable host is not a lost node
    assert lost_nodes(hosts, ["self", "refused", "up", "unreachable"], 0, True) == []


def test_a_beacon_answers_and_a_closed_port_refuses():
    import socket
    import threading

    from ddlbench.launch.liveness import _accept_forever, knock
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        threading.Thread(target=_accept_forever, args=(s,), daemon=True).start()
        assert knock("127.0.0.1", s.getsockname()[1], 2.0) == "up"
        assert knock("127.0.0.1", s.getsockname()[1], 2.0) == "up"      # the beacon keeps answering
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                                       # bound, not listening
        assert knock("127.0.0.1", port, 2.0) == "refused"


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_own_network_is_read_in_the_processes_namespace():
    """In a fresh network namespace: only loopback -> down; a veth pair up -> up; one end
    taken down -> down (no carrier on the other)."""
    py = f"{sys.executable} -c 'from ddlbench.launch.liveness import own_network_up as f; print(f())'"
    veth = "ip link add name va type veth peer name vb && ip link set va up && ip link set vb up"
    script = f"{py} && {veth} && {py} && ip link set vb down && {py}"
    out = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["False", "True", "False"], out.stderr


def test_a_timeout_names_the_ranks_work_not_its_beacon():
    """A rank's stack dump lists the beacon's thread (waiting in accept, through bench's own
    code) before the thread that hangs: the summary names the hang."""
    from ddlbench.launch.records import where_each_rank_was
    dump = ('Thread 0x00007f01 (most recent call first):\n'
            '  File "/usr/lib/python3.11/socket.py", line 294 in accept\n'
            '  File "/repo/ddlbench/launch/liveness.py", line 32 in _accept_forever\n'
            '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
            '\n'
            'Current thread 0x00007f02 (most recent call first):\n'
            '  File "/repo/ddlbench/rank/faults.py", line 30 in hang\n'
            '  File "/repo/ddlbench/rank/runner.py", line 120 in run\n')
    assert where_each_rank_was({"1": dump}) == "rank 1: faults.py:30 hang"
    only_beacon = dump.split("\n\n")[0]
    assert where_each_rank_was({"0": only_beacon}) == "rank 0: socket.py:294 accept <- ddlbench/launch/liveness.py:32 _accept_forever"
    # the NVML sampler's thread (ddlbench's code, started with threading) is not the rank's work
    # either: seen on an H200, where a timeout named nvml.py's wait instead of the forward
    sampler = ('Thread 0x00007f03 (most recent call first):\n'
               '  File "/usr/lib/python3.12/threading.py", line 359 in wait\n'
               '  File "/repo/ddlbench/machine/nvml.py", line 131 in _loop\n'
               '  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner\n'
               '  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap\n\n')
    main = ('Current thread 0x00007f04 (most recent call first):\n'
            '  File "/venv/torch/nn/modules/linear.py", line 134 in forward\n'
            '  File "/repo/ddlbench/adapters/fsdp2.py", line 171 in train_step\n')
    assert where_each_rank_was({"0": sampler + main}) == \
        "rank 0: linear.py:134 forward <- ddlbench/adapters/fsdp2.py:171 train_step"
    # a library inside a checkout that happens to be called ddlbench is not the package
    from ddlbench.launch.records import _in_package
    assert _in_package("/home/u/ddlbench/.venv/lib/python3.11/site-packages/torch/nn/module.py") is None
    assert _in_package("/opt/venv/lib/python3.11/site-packages/ddlbench/rank/runner.py") == "rank/runner.py"


def test_the_hosts_exchanged_when_the_group_formed_are_used_without_a_collective():
    import torch

    from ddlbench.adapters.base import RankContext
    from ddlbench.comm.topology import hosts_of
    ctx = RankContext(rank=1, local_rank=0, world_size=2, device=torch.device("cpu"), backend="gloo",
                      precision="fp32", hosts=("n1", "n2"))
    assert hosts_of(ctx) == ["n1", "n2"]      # no process group exists here: a gather would raise
