"""`bench cluster`: an emulated 2-node cluster on this machine (network namespaces, a bridge,
veth links shaped with tbf, a real Slurm with accounting), and what runs in it.

The plan is pure and checked by hand; the cluster itself is built once for the module (as root,
like the single-node test Slurm) at 100 Mbit/s, so a link-bound all-reduce is slow enough that
the machine's load cannot hide the shaping."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, emulated_cluster, run_bounded, wait_for

from ddlbench.cluster.plan import (
    hosts_file,
    make_plan,
    network_description,
    payload_share,
    rate_bits,
    slurm_conf,
    split_cores,
    tbf_burst_bytes,
)
from ddlbench.errors import ConfigError

BENCH = str(REPO / ".venv" / "bin" / "bench")
NAME = "ddlbtest"
LINK = "100mbit"


def test_rates_and_cores():
    from ddlbench.cluster.world import cpu_mask
    assert (cpu_mask([0]), cpu_mask([1]), cpu_mask([1, 2]), cpu_mask(range(12))) == ("1", "2", "6", "fff")
    assert (cpu_mask([32]), cpu_mask([0, 40]), cpu_mask([64])) == ("1,00000000", "100,00000001", "1,00000000,00000000")
    assert rate_bits("1gbit") == 1e9 and rate_bits("100mbit") == 1e8 and rate_bits("2.5gbit") == 2.5e9
    for bad in ("1gbps", "fast", "10kbit"):
        with pytest.raises(ConfigError):
            rate_bits(bad)
    assert split_cores([0, 1], 2) == [(0,), (1,)]
    assert split_cores([0, 1, 2, 3, 4], 2) == [(0, 1), (2, 3)]     # equal shares; core 4 unused
    with pytest.raises(ConfigError, match="each node needs its own core"):
        split_cores([0, 1], 3)
    assert tbf_burst_bytes(1e8) == 128 << 10                         # 1 ms at 100 Mbit/s is 12.5 KB
    assert tbf_burst_bytes(10e9) == 1_250_000                         # 1 ms at 10 Gbit/s


def test_plan_files():
    p = make_plan(2, "1gbit", [0, 1], "/st", name="box")
    assert [(n.name, n.addr, n.cores) for n in p.nodes] == [("n1", "10.88.0.1", (0,)), ("n2", "10.88.0.2", (1,))]
    assert hosts_file(p) == "127.0.0.1 localhost\n10.88.0.254 head\n10.88.0.1 n1\n10.88.0.2 n2\n"
    conf = slurm_conf(p, 4000)
    assert "SlurmctldHost=head(10.88.0.254)" in conf and "NodeName=n2 NodeAddr=10.88.0.2 CPUs=1 RealMemory=4000" in conf
    assert "PartitionName=box Nodes=n1,n2 Default=YES" in conf and "AccountingStorageType=accounting_storage/slurmdbd" in conf
    net = network_description(p)
    # the data a 1 Gbit/s link carries: 1448 of every 1514 bytes tbf meters (TCP over MTU 1500), and
    # tbf's bucket (128 KiB at this rate) in the same bytes
    assert payload_share(1500) == 1448 / 1514 and payload_share(9000) == 8948 / 9014
    assert net["dimensions"][1] == {"name": "link", "size": 2, "bandwidth_GBps": pytest.approx(0.125 * 1448 / 1514),
                                    "latency_us": 100.0, "cost_per_GBps": 1.0,
                                    "burst_bytes": pytest.approx(131072 * 1448 / 1514)}
    # communication threads first unless asked otherwise (ddlbench/comm/threads.py)
    assert p.comm_threads == "fifo" and p.to_dict()["comm_threads"] == "fifo"
    assert make_plan(2, "1gbit", [0, 1], "/st", comm_threads="fair").comm_threads == "fair"
    with pytest.raises(ConfigError, match="comm_threads='rt': one of fair, fifo"):
        make_plan(2, "1gbit", [0, 1], "/st", comm_threads="rt")


def cluster(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_bounded([BENCH, "cluster", *args], timeout, capture_output=True, text=True, cwd=REPO,
                       stdin=subprocess.DEVNULL)


def login(*cmd: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)


def test_bad_input_is_refused_before_anything_is_built():
    proc = cluster("up", f"name={NAME}x", "link=fast")
    assert proc.returncode == 2 and "kbit, mbit or gbit" in proc.stderr, proc.stderr
    proc = cluster("up", f"name={NAME}x", "comm_threads=rt")
    assert proc.returncode == 2 and "one of fair, fifo" in proc.stderr, proc.stderr
    proc = cluster("exec", "hostname")
    assert proc.returncode == 2 and "after --" in proc.stderr
    proc = cluster("frobnicate")
    assert proc.returncode == 2 and "usage: bench cluster up" in proc.stderr


@pytest.fixture(scope="module")
def box():
    yield from emulated_cluster(NAME, "nodes=2", f"link={LINK}")


@pytest.mark.slow
def test_two_nodes_with_their_own_hosts_cores_and_addresses(box):
    proc = login("srun", "-N2", "--ntasks-per-node=1", "bash", "-c",
                 "echo $(hostname) $(grep Cpus_allowed_list /proc/self/status | cut -f2) $(ip -4 -br addr show eth0)")
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split() for line in proc.stdout.splitlines())
    assert [r[0] for r in rows] == ["n1", "n2"]
    assert rows[0][1] != rows[1][1]                                  # disjoint cores
    assert rows[0][4].startswith("10.88.0.1/") and rows[1][4].startswith("10.88.0.2/")
    from ddlbench.cluster.world import cpu_mask
    # receive steering: each node's packets, in and out through the switch, on its own cores
    for node, (_, cores, *_) in zip(("n1", "n2"), rows):
        ids = [c for part in cores.split(",") for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        mask = cpu_mask(ids)
        for ns, dev in ((node, "eth0"), ("head", f"v{node}")):
            got = login("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/queues/rx-0/rps_cpus").stdout
            assert got.strip().lstrip("0,") == mask, (ns, dev, got)
    # accounting: the job, with its two nodes, reaches slurmdbd (asynchronously: poll)
    def accounted() -> bool:
        out = login("sacct", "-n", "-X", "-P", "-o", "JobName,NNodes,NodeList,State").stdout.split()
        return "bash|2|n[1-2]|COMPLETED" in out
    wait_for(accounted, 60, "the srun job in sacct")


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["ddp", "deepspeed_zero2", "horovod"])
def test_frameworks_across_two_nodes_under_slurm(box, tmp_path, framework):
    """launcher=slurm with one rank per node: DDP, DeepSpeed and Horovod (under srun, without
    horovodrun) across two hosts; the record names the host of every rank."""
    run_dir = tmp_path / "run"
    proc = login("srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", BENCH, "run", "launcher=slurm",
                 f"framework={framework}", "model=gpt2_tiny", "debug=fast", f"run.dir={run_dir}", "run.timeout_s=200")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["rank_hosts"] == ["n1", "n2"] and rec["parallel"]["nodes"] == 2
    assert rec["comm"]["wire_bytes_per_rank"] > 0
    # `bench cluster`'s default: every rank's gloo threads SCHED_FIFO (ddlbench/comm/threads.py)
    assert rec["env"]["comm_threads"]["policy"] == "fifo"
    assert all("gloo_tcp_loop" in names for names in rec["env"]["comm_threads"]["per_rank"])
    # the network it ran on, as `bench cluster` described it: the link at 100 Mbit/s (its data: 1448 of 1514)
    assert rec["env"]["network"]["description"]["dimensions"][1]["bandwidth_GBps"] == pytest.approx(0.0125 * 1448 / 1514)
    _records[framework] = rec


_records: dict[str, dict] = {}


def slurm_run(run_dir: Path, nodes: int, *overrides: str) -> dict:
    proc = login("srun", f"-N{nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", BENCH, "run", "launcher=slurm",
                 "model=gpt2_tiny", "debug=fast", f"run.dir={run_dir}", "run.timeout_s=200", *overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((run_dir / "result.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["daso", "fsdp_hybrid"])
def test_node_groups_follow_the_nodes(box, tmp_path, framework):
    """2 nodes x 2 ranks (each node's ranks share its one core: srun -O), numbered cyclically
    (ranks 0, 2 on n1; 1, 3 on n2), so groups of consecutive ranks would each span both nodes.
    DASO's node groups and hybrid sharding's shard groups are the ranks of one host each; by the
    collective counter only the cross-node sync leaves a node (in groups of 2 ranks on 2 nodes):
    DASO's parameters in bf16 (2 bytes each), HSDP's all-reduce of a half-shard of fp32
    gradients (4 bytes x params / 2); gradients (DASO) and gathers/reduce-scatters (HSDP) stay
    inside the node."""
    run_dir = tmp_path / "run"
    proc = login("srun", "-N2", "-n4", "--overcommit", "--distribution=cyclic", "--kill-on-bad-exit=1", BENCH, "run",
                 "launcher=slurm", f"framework={framework}", "model=gpt2_tiny", "debug=fast", f"run.dir={run_dir}",
                 "run.timeout_s=200")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok", rec["error"]
    hosts = rec["env"]["rank_hosts"]
    assert hosts == ["n1", "n2", "n1", "n2"]
    native = rec["framework"]["native_config"]
    groups = native["node_groups"] if framework == "daso" else native["mesh"]["ranks"]
    assert sorted(groups) == [[0, 2], [1, 3]]
    assert sorted(hosts[g[0]] for g in groups) == ["n1", "n2"]
    assert all(len({hosts[r] for r in g}) == 1 for g in groups)
    params = rec["model"]["params"]
    by_group = rec["comm"]["per_step_bytes_by_group"]
    crossing = {kind: b["2@2"] for kind, b in by_group.items() if "2@2" in b}
    inside = {kind for kind, b in by_group.items() if "2@1" in b}
    if framework == "daso":
        assert crossing == {"all_reduce": 2 * params} and inside == {"all_reduce", "broadcast"}
    else:
        assert crossing == {"all_reduce": 4 * params / 2} and inside == {"all_gather", "reduce_scatter"}


@pytest.mark.slow
def test_a_slurm_sweep_whose_cells_span_two_nodes(box, tmp_path):
    """`bench sweep --backend slurm` with launcher=slurm cells of 2 ranks on 2 nodes: the array
    task asks for 2 nodes x 2 tasks and starts the cell's ranks with srun; every cell's record
    has a rank on each node and the cluster's network."""
    sweep = tmp_path / "sweep"
    proc = login(BENCH, "sweep", "--backend", "slurm", "--dir", str(sweep), "launcher=slurm", "launcher.nodes=2",
                 "launcher.nproc=2", "framework=ddp,daso", "model=gpt2_tiny", "debug=fast")
    assert proc.returncode == 0 and "2 node(s) x 2 task(s)" in proc.stdout, proc.stdout + proc.stderr
    wait_for(lambda: "2 cells: 2 ok" in login(BENCH, "sweep", "status", str(sweep)).stdout, 180, "both cells ok")
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]
    assert sorted(r["framework"]["name"] for r in records) == ["daso", "ddp"]
    for rec in records:
        assert rec["env"]["rank_hosts"] == ["n1", "n2"] and rec["parallel"]["nodes"] == 2
        assert rec["env"]["network"]["description"]["name"] == f"cluster_{NAME}"


@pytest.mark.slow
def test_a_two_node_run_is_priced_on_the_link_it_ran_on(box, tmp_path):
    """The projection check (bench report, bench project) prices a run's collectives on the
    network it recorded: DDP's all-reduce over the 100 Mbit/s link between n1 and n2 (by hand:
    2 alpha + bytes / 11.96 MB/s, the data of 12.5 MB/s of frames), its compute from a 1-rank run on one node, each node's one rank
    on its own core (no oversubscription)."""
    from ddlbench.network.model import recorded_network
    from ddlbench.project.validate import predict
    rec = _records.get("ddp") or slurm_run(tmp_path / "two", 2, "framework=ddp")
    one = slurm_run(tmp_path / "one", 1, "framework=ddp", "run.global_batch=4")
    assert rec["status"] == one["status"] == "ok"
    net = recorded_network(rec)
    data = 12.5e6 * 1448 / 1514        # the data 100 Mbit/s of frames carry (cluster.plan.payload_share)
    assert [d.name for d in net.dims] == ["node", "link"] and net.dims[1].bandwidth == pytest.approx(data)
    assert net.dims[1].burst_bytes == pytest.approx(131072 * 1448 / 1514)     # tbf's bucket, same bytes
    p = predict(rec, one, net)
    payload = rec["comm"]["per_step_bytes"]["all_reduce"]
    assert p["comm_s"] == pytest.approx(2 * 100e-6 + payload / data, rel=1e-9)
    assert p["oversubscription"] == 1.0 and p["compute_s"] == pytest.approx(one["timing"]["step_time_s"]["median"])
    print(f"DDP across 2 nodes at {LINK}: measured {p['measured_step_s'] * 1e3:.1f} ms, predicted "
          f"{p['predicted_step_s'] * 1e3:.1f} ms ({p['relative_error']:+.1%})")


@pytest.mark.slow
def test_commbench_across_nodes_fits_the_link(box, tmp_path):
    """`bench commbench launcher=slurm` over two nodes: the all-reduce fit's bandwidth is the
    link's (gloo's framing and the CPU cost a little: measured here ~0.95 of the rate at 100 Mbit/s,
    bound 0.8); no measured all-reduce beats the shaper (its time at least its wire bytes less tbf's
    bucket over the rate: a bound noise cannot break, where a least-squares slope over noisy sizes
    can read above the rate: 1.04x seen on a loaded VM); network.yaml is the cluster's description
    with the link priced by the fit."""
    import yaml
    out = tmp_path / "cb"
    proc = login("srun", "-N2", "--ntasks-per-node=1", BENCH, "commbench", "launcher=slurm", "kinds=[all_reduce]",
                 "sizes=[262144,1048576,2097152]", "iters=5", "warmup=1", f"out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((out / "commbench.json").read_text())
    assert sorted(rec["hosts"]) == ["n1", "n2"] and rec["launcher"] == "slurm" and rec["world_size"] == 2
    assert rec["comm_threads"]["policy"] == "fifo" and all(rec["comm_threads"]["per_rank"])
    (fit,) = rec["fits"]
    print(f"all-reduce fit at {LINK}: {fit['bandwidth_Bps'] / 1e6:.2f} MB/s, alpha {fit['alpha_s'] * 1e6:.0f} us")
    rate, bucket = rate_bits(LINK) / 8, 131072 * 1448 / 1514      # bytes/s; tbf's bucket in payload bytes
    assert 0.8 <= fit["bandwidth_Bps"] / rate
    for row in rec["rows"]:      # 2 ranks: each sends its whole buffer (half reduce-scattered, half gathered)
        assert row["time_s"] >= (row["bytes"] - bucket) / rate * 0.98, row
    net = yaml.safe_load((out / "network.yaml").read_text())
    assert net["dimensions"][1]["bandwidth_GBps"] == pytest.approx(fit["bandwidth_Bps"] / 1e9, rel=1e-5)
    assert net["dimensions"][0]["bandwidth_GBps"] == 1.0 and net["name"] == f"cluster_{NAME}_fitted"


@pytest.mark.slow
def test_a_node_lost_mid_run_is_a_recorded_failure_that_names_the_lost_node(box, tmp_path):
    """n2's link goes down during a 2-node DDP run: the ranks' collectives time out
    (run.pg_timeout_s); the record is `failed` and names n2 as the lost node, whichever rank
    writes it (rank 0 on n1 finds n2's beacon unreachable; rank 1 on n2 finds its own network
    down: ddlbench/launch/liveness.py). Slurm marks n2 down (SlurmdTimeout) and ends the job
    (NODE_FAIL) while the link is still down; nothing of the run is left on any node. Then the
    link comes back and n2 is resumed for the tests after this one."""
    from conftest import wait_until_training
    run_dir = tmp_path / "run"
    job = subprocess.Popen([BENCH, "cluster", "exec", f"name={NAME}", "--", "srun", "-N2", "--ntasks-per-node=1",
                            "--kill-on-bad-exit=1", BENCH, "run", "launcher=slurm", "framework=ddp", "model=gpt2_tiny",
                            "debug=fast", "run.measure_steps=100000", "run.pg_timeout_s=20", "run.timeout_s=200",
                            f"run.dir={run_dir}"], cwd=REPO, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_training(run_dir, 2)
        assert login("ip", "-n", "n2", "link", "set", "eth0", "down").returncode == 0
        wait_for(lambda: (run_dir / "result.json").exists(), 120, "a result after the link went down")
        job.wait(timeout=150)                           # Slurm ends the job: n2 stopped answering
        rec = json.loads((run_dir / "result.json").read_text())
        assert rec["status"] in ("failed", "timeout"), rec["status"]
        assert rec["error"]["lost_nodes"] == ["n2"], rec["error"]
        assert "n2 lost" in rec["error"]["message"]
        assert "Timed out" in rec["error"]["message"] or "onnection" in rec["error"]["message"], rec["error"]
        acct = login("sacct", "-n", "-X", "-P", "-o", "State,NodeList").stdout.split()
        assert "NODE_FAIL|n[1-2]" in acct, acct
    finally:
        login("ip", "-n", "n2", "link", "set", "eth0", "up")
        if job.poll() is None:
            login("scancel", "--full", "--user=root")
            job.kill()
    wait_for(lambda: not login("squeue", "-h").stdout.strip(), 60, "the job to leave the queue (completing on n1)")
    from ddlbench.cluster.world import processes_in
    left = [p for p in processes_in(box["world"])
            if str(run_dir) in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert left == [], left
    login("scontrol", "update", "NodeName=n2", "State=RESUME")
    wait_for(lambda: "n2 idle" in login("sinfo", "-h", "-N", "-o", "%N %T").stdout.splitlines(), 90,
             "n2 back in service")


@pytest.mark.slow
def test_an_all_reduce_takes_the_time_the_link_rate_says(box):
    """16 MiB between two nodes: a ring all-reduce sends the whole buffer once over each
    direction of the path (2 (N-1)/N x 16 MiB at N = 2), so bytes x 8 / rate = 1.34 s at
    100 Mbit/s. The shaper cannot be beaten (>= 0.95x); gloo's framing and the CPU add a little
    (measured here: ~1.05x); 1.5x is the bound."""
    proc = login("srun", "-N2", "--ntasks-per-node=1", str(REPO / ".venv" / "bin" / "python"),
                 str(REPO / "tests" / "cluster_allreduce.py"), "n1", str(16 << 20), "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(out["hosts"]) == ["n1", "n2"]
    expected = out["bytes"] * 8 / rate_bits(LINK)
    print(f"all-reduce {out['bytes']} B: {out['median_s']:.3f} s, bytes/rate {expected:.3f} s, "
          f"ratio {out['median_s'] / expected:.3f}")
    assert 0.95 <= out["median_s"] / expected <= 1.5


@pytest.mark.slow
def test_down_leaves_nothing(box):
    """Runs last in the module: every process of the cluster's world ends, so its namespaces,
    veths and qdiscs go with them; the machine's own interfaces are as they were."""
    from ddlbench.cluster.world import processes_in
    before = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert processes_in(box["world"])                               # the daemons are there to end
    proc = cluster("down", f"name={NAME}")
    assert proc.returncode == 0, proc.stderr
    assert processes_in(box["world"]) == []
    assert subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout == before
    assert cluster("status", f"name={NAME}").returncode == 1
    assert not (Path("/var/tmp/ddlbench-cluster") / NAME / "cluster.json").exists()


def test_preflight_says_what_is_missing(monkeypatch):
    import shutil

    from ddlbench.cluster import world
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert world.preflight() == "bench cluster needs root (network namespaces, veth pairs, tc)"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None if name in ("slurmd", "tc") else f"/usr/bin/{name}")
    assert world.preflight().startswith("bench cluster: missing tc, slurmd (")


def test_the_build_script_shapes_both_directions_of_every_link():
    from ddlbench.cluster.world import build_script
    script = build_script(make_plan(2, "1gbit", [0, 1], "/st"))
    for node in ("n1", "n2"):
        assert f"tc -n {node} qdisc replace dev eth0 root tbf rate 1000000000bit" in script
        assert f"tc -n head qdisc replace dev v{node} root tbf rate 1000000000bit" in script
        assert f"taskset -c {node[1:] and int(node[1:]) - 1} slurmd -N {node}" in script
        mask = 1 << (int(node[1:]) - 1)
        assert f"ip netns exec {node} sh -c '[ ! -e /sys/class/net/eth0/queues/rx-0/rps_cpus ] || echo {mask}" in script
        assert f"ip netns exec head sh -c '[ ! -e /sys/class/net/v{node}/queues/rx-0/rps_cpus ] || echo {mask}" in script
    assert script.index("mount -t tmpfs") < script.index("ip netns add head")   # the world's own /run first


def test_a_plan_with_devices_has_two_shaped_dimensions():
    """devices_per_node=2 dev_link=R: a namespace per device at 10.88.i.(d+1), its link into the
    node's switch shaped at R both ways, the node's uplink at link=; the network description
    carries both dimensions; device cores are shares of the node's, or the node's when too few."""
    from ddlbench.cluster.world import build_script
    p = make_plan(2, "100mbit", [0, 1, 2, 3], "/st", devices_per_node=2, dev_link="400mbit")
    assert [[(d.name, d.addr, d.cores) for d in n.devices] for n in p.nodes] == [
        [("n1d0", "10.88.1.1", (0,)), ("n1d1", "10.88.1.2", (1,))],
        [("n2d0", "10.88.2.1", (2,)), ("n2d1", "10.88.2.2", (3,))]]
    assert p.devices_per_node == 2
    assert "10.88.1.2 n1d1\n" in hosts_file(p) and "10.88.0.2 n2\n" in hosts_file(p)
    dims = network_description(p)["dimensions"]
    # per device, as the network model counts: the node's uplink shared by its two devices
    assert [(d["name"], d["size"], d["bandwidth_GBps"] / payload_share(1500)) for d in dims] == [
        ("node", 2, pytest.approx(0.05)), ("link", 2, pytest.approx(0.00625))]
    shared = make_plan(2, "100mbit", [0, 1], "/st", devices_per_node=2, dev_link="400mbit")
    assert [d.cores for d in shared.nodes[1].devices] == [(1,), (1,)]
    script = build_script(p)
    for node in ("n1", "n2"):
        assert f"tc -n {node} qdisc replace dev up0 root tbf rate 100000000bit" in script   # node -> head switch
        assert f"tc -n head qdisc replace dev v{node} root tbf rate 100000000bit" in script
        assert f"ip -n {node} addr add 10.88.0.{node[1]}/16 dev brn" in script           # slurmd's address
        for d in (0, 1):
            assert f"tc -n {node}d{d} qdisc replace dev eth0 root tbf rate 400000000bit" in script
            assert f"tc -n {node} qdisc replace dev d{d} root tbf rate 400000000bit" in script
            assert f"ip -n {node} link set d{d} master brn up" in script
    with pytest.raises(ConfigError, match="needs dev_link=RATE"):
        make_plan(2, "1gbit", [0, 1], "/st", devices_per_node=2)
    with pytest.raises(ConfigError, match="give devices_per_node >= 2"):
        make_plan(2, "1gbit", [0, 1], "/st", dev_link="1gbit")
    assert " mtu " not in script          # 1500: the kernel's own, nothing to set


def test_jumbo_frames_reach_every_link_and_switch():
    """mtu=9000: both ends of every veth (uplinks, device links) and every bridge, and the network
    description says so; an MTU outside Ethernet's range is refused."""
    from ddlbench.cluster.world import build_script
    p = make_plan(2, "100mbit", [0, 1], "/st", devices_per_node=2, dev_link="400mbit", mtu=9000)
    set_mtu = {tuple(line.split()[2:7:4]) for line in build_script(p).splitlines() if line.endswith(" mtu 9000")}
    # (namespace, device) pairs
    assert set_mtu == {("head", "br0"), ("head", "vn1"), ("head", "vn2"),
                       *{(n, d) for n in ("n1", "n2") for d in ("up0", "brn", "d0", "d1")},
                       *{(f"n{i}d{d}", "eth0") for i in (1, 2) for d in (0, 1)}}
    assert "MTU 9000" in network_description(p)["description"]
    with pytest.raises(ConfigError, match="mtu=100: between 1280 and 65535"):
        make_plan(2, "1gbit", [0, 1], "/st", mtu=100)


def test_a_task_finds_its_device_and_the_rendezvous_its_device_zero():
    from ddlbench.cluster.device_task import INSIDE, device_of, master_host, nsenter_argv
    plan = make_plan(2, "100mbit", [0, 1], "/st", devices_per_node=2, dev_link="400mbit").to_dict()
    dev = device_of(plan, "n2", 1)
    assert dev["name"] == "n2d1" and dev["addr"] == "10.88.2.2"
    assert nsenter_argv(dev, ["python", "bench", "run"]) == ["nsenter", "--net=/run/netns/n2d1", "--", "python",
                                                              "bench", "run"]
    with pytest.raises(ConfigError, match="srun --ntasks-per-node <= 2"):
        device_of(plan, "n1", 2)
    assert master_host("n1", {INSIDE: "n1d0"}) == "n1d0" and master_host("n1", {}) == "n1"
