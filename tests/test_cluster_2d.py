"""`bench cluster` with a second shaped dimension: 2 nodes x 2 devices, each device a network
namespace of its own linked to its node's switch at dev_link, the nodes' uplinks at link
(ddlbench/cluster/plan.py). A 4-rank run under Slurm lands one rank in each device and records both
dimensions; `down` returns once every process of the cluster is gone from /proc (zombies
included: `pgrep` lists those). The plan itself is checked by hand in tests/test_cluster.py."""
from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, emulated_cluster, run_bounded

BENCH = str(REPO / ".venv" / "bin" / "bench")
NAME = "ddlb2d"
LINK, DEV_LINK = "100mbit", "400mbit"


def cluster(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_bounded([BENCH, "cluster", *args], timeout, capture_output=True, text=True, cwd=REPO,
                       stdin=subprocess.DEVNULL)


def login(*cmd: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)


@pytest.fixture(scope="module")
def box2d():
    yield from emulated_cluster(NAME, "nodes=2", "devices_per_node=2", f"link={LINK}", f"dev_link={DEV_LINK}", "mtu=9000")


@pytest.mark.slow
def test_four_ranks_one_per_device_record_both_dimensions(box2d, tmp_path):
    run_dir = tmp_path / "run"
    proc = login("srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", BENCH, "run", "launcher=slurm",
                 "framework=ddp", "model=gpt2_tiny", "debug=fast", "launcher.nproc=4", f"run.dir={run_dir}",
                 "run.timeout_s=200")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["rank_hosts"] == ["n1", "n1", "n2", "n2"] and rec["parallel"]["nodes"] == 2
    assert rec["env"]["rank_devices"] == ["n1d0", "n1d1", "n2d0", "n2d1"]
    dims = rec["env"]["network"]["description"]["dimensions"]
    # within a node each device's own link (400 Mbit/s); across nodes the node's uplink, shared by its 2 devices
    share = 8948 / 9014             # the data of the frames tbf meters at mtu=9000 (cluster.plan.payload_share)
    assert [(d["name"], d["size"], d["bandwidth_GBps"] / share) for d in dims] == [
        ("node", 2, pytest.approx(0.05)), ("link", 2, pytest.approx(0.00625))]
    assert rec["env"]["env_vars"].get("GLOO_SOCKET_IFNAME") == "eth0"


@pytest.mark.slow
def test_each_device_has_one_shaped_link_and_the_node_switch_holds_slurmds_address(box2d):
    """A device namespace holds one link (eth0 at its address, shaped at dev_link); the node's
    namespace holds its switch (slurmd's address) with the uplink and one port per device. That the
    devices of two nodes reach each other, the 4-rank run above shows."""
    dev = login("ip", "netns", "exec", "n1d1", "sh", "-c", "ip -4 -br addr show eth0; tc qdisc show dev eth0")
    assert dev.returncode == 0, dev.stderr
    assert "10.88.1.2/16" in dev.stdout and "rate 400Mbit" in dev.stdout
    node = login("ip", "netns", "exec", "n1", "sh", "-c", "ip -4 -br addr show brn; ip -br link show master brn; "
                 "tc qdisc show dev up0")
    assert node.returncode == 0, node.stderr
    assert "10.88.0.1/16" in node.stdout and "rate 100Mbit" in node.stdout
    assert {line.split("@")[0] for line in node.stdout.splitlines() if "@" in line} >= {"up0", "d0", "d1"}


@pytest.mark.slow
def test_commbench_fits_each_dimension_at_its_rate(box2d, tmp_path):
    """The node's all-reduce fitted with p = 2 devices, the cross-node one with p = 2 nodes, against
    the device link (50 MB/s) and the device's share of the uplink (6.25 MB/s). What cannot depend on
    the machine's load: the shaper cannot be beaten (the largest message's time, with no latency at
    all, implies at most the described rate), and each fit lands on its own link (within 2x of it,
    where the two differ 8x). How close the fit comes is a measurement, not asserted: with jumbo
    frames (mtu=9000), 10 runs on an idle VM at 1-4 MiB x 5-9 iterations: node 0.993-1.001x, link
    0.928-0.988x; a run beside the whole suite fitted the link at 1.043x (a 15 ms latency fitted
    from two sizes trades against the bandwidth). At MTU 1500 headers and acknowledgements cost
    4-8% of the 100 Mbit/s uplink and the link fit was 0.852-0.947x (docs/cluster.md)."""
    from ddlbench.network.fit import coefficients
    out = tmp_path / "cb"
    proc = login("srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", BENCH, "commbench", "launcher=slurm",
                 "kinds=[all_reduce_node,all_reduce_cross,all_reduce_hier]", "sizes=[1048576,4194304]",
                 "iters=5", f"out={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((out / "commbench.json").read_text())
    assert rec["hosts"] == ["n1", "n1", "n2", "n2"]
    fits = rec["dimension_fits"]
    for dim in ("node", "link"):
        fit = fits[dim]
        assert 0.5 <= fit["fit_over_described"] <= 2, (dim, fit)
        largest = max((r for r in rec["rows"] if r["kind"] == fit["kind"]), key=lambda r: r["bytes"])
        _, volume = coefficients("all_reduce", fit["world_size"], "gloo")
        at_most = volume * largest["bytes"] / largest["time_s"]      # the rate if latency were zero
        assert at_most <= 1.02 * fit["described_bandwidth_Bps"], (dim, at_most, fit)
    assert {r["kind"] for r in rec["rows"]} == {"all_reduce_node", "all_reduce_cross", "all_reduce_hier"}


@pytest.mark.slow
def test_down_returns_once_every_process_is_gone(box2d):
    """Runs last: the pids of the cluster's world, taken before `down`, are all gone from /proc the
    moment it returns (not only out of the world: no zombie left for `pgrep -x slurmd` to find)."""
    from ddlbench.cluster.world import processes_in, started
    pids = {p: started(p) for p in processes_in(box2d["world"])}
    assert len(pids) >= 4
    proc = cluster("down", f"name={NAME}")
    assert proc.returncode == 0, proc.stderr
    assert [p for p, t in pids.items() if started(p) == t] == []
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("n1d0") == 0
