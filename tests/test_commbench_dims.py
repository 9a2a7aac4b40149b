"""commbench across two dimensions (ddlbench/commbench/dims.py), by hand: ranks grouped by host,
group sizes, and the per-dimension fits from synthetic times made with known α and bandwidth."""
from __future__ import annotations

import pytest

from ddlbench.commbench.dims import dimension_fits, group_size, host_groups
from ddlbench.errors import ConfigError


def test_groups_by_host():
    nodes, cross = host_groups(["n1", "n1", "n2", "n2"])
    assert nodes == [[0, 1], [2, 3]] and cross == [[0, 2], [1, 3]]
    nodes, cross = host_groups(["a", "b", "a", "b", "a", "b"])        # cyclic placement
    assert nodes == [[0, 2, 4], [1, 3, 5]] and cross == [[0, 1], [2, 3], [4, 5]]
    for bad in (["n1", "n1"], ["n1", "n2"], ["n1", "n1", "n2"]):
        with pytest.raises(ConfigError, match=">= 2 hosts with the same number"):
            host_groups(bad)
    assert (group_size("all_reduce_node", 2, 3), group_size("all_reduce_cross", 2, 3),
            group_size("all_reduce_hier", 2, 3)) == (2, 3, 6)


def test_each_dimension_is_fitted_with_its_own_group_size():
    # ring all-reduce over p ranks: 2(p-1) alpha + 2(p-1)/p B / bw; node: p=2, 50 MB/s, 100 us;
    # link: p=2 nodes, 6.25 MB/s per device, 200 us
    def t(b, p, alpha, bw):
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * b / bw
    sizes = [1 << 16, 1 << 20, 1 << 22]
    rows = ([{"kind": "all_reduce_node", "bytes": b, "time_s": t(b, 2, 100e-6, 50e6)} for b in sizes]
            + [{"kind": "all_reduce_cross", "bytes": b, "time_s": t(b, 2, 200e-6, 6.25e6)} for b in sizes]
            + [{"kind": "all_reduce_hier", "bytes": b, "time_s": 1.0} for b in sizes])
    described = [{"name": "node", "bandwidth_GBps": 0.05}, {"name": "link", "bandwidth_GBps": 0.00625}]
    got = dimension_fits(rows, per_node=2, nodes=2, backend="gloo", described=described)
    assert set(got) == {"node", "link"}
    assert got["node"]["bandwidth_Bps"] == pytest.approx(50e6) and got["node"]["alpha_s"] == pytest.approx(100e-6)
    assert got["link"]["bandwidth_Bps"] == pytest.approx(6.25e6) and got["link"]["alpha_s"] == pytest.approx(200e-6)
    assert got["node"]["fit_over_described"] == pytest.approx(1.0) and got["link"]["world_size"] == 2
    assert "fit_over_described" not in dimension_fits(rows, 2, 2, "gloo", None)["node"]
