"""Node groups follow the hosts the ranks run on (bench/topology.py), by hand."""
import pytest

from bench.errors import ConfigError
from bench.topology import cross_groups, node_groups, node_of


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
