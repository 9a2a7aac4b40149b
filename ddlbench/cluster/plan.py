"""The emulated cluster's plan, as pure functions: addresses, cores, link rates, and the files
its daemons read (slurm.conf, slurmdbd.conf, hosts, the conf/network description).

One subnet (10.88.0.0/16) on a bridge in the head node's network namespace; node i (n1, n2, ...)
at 10.88.0.i, the head (slurmctld, slurmdbd, the login node) at .254. Every link is a veth pair
node <-> bridge, shaped in both directions with tbf at the inter-node rate: traffic between two
nodes crosses two shaped links, each at the rate, so the path's bandwidth is the rate.

With devices_per_node >= 2 (and dev_link=), a second dimension: each device is a namespace of
its own (n1d0, n1d1, ... at 10.88.i.(d+1)) whose link into its node's switch (a bridge in the
node's namespace, where slurmd lives) is shaped at dev_link; the node's uplink to the head's
switch at link. Two devices of a node talk over two device links; devices of two nodes over their
device links and both uplinks. Ranks started by srun move into their device's namespace
(ddlbench/cluster/device_task.py).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ddlbench.comm.threads import POLICIES
from ddlbench.errors import ConfigError

NET = "10.88"
PREFIX = 16
SUBNET = f"{NET}.0"
HEAD_ADDR = f"{SUBNET}.254"
PORTS = {"slurmctld": 7817, "slurmd": 7818, "slurmdbd": 7819}
DEFAULT_MTU = 1500      # what the kernel gives a veth
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}


def rate_bits(rate: str) -> float:
    """tc's rate spelling ('1gbit', '100mbit', '2.5gbit') -> bits/s. Only bit units: tc reads
    'bps' as bytes per second, a factor of 8 nobody means on a command line."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit|tbit|bit)\s*", rate.lower())
    if not m:
        raise ConfigError(f"link rate {rate!r}: write a number and kbit, mbit or gbit (e.g. link=1gbit)")
    value = float(m.group(1)) * UNITS[m.group(2)]
    if value < 1e5:
        raise ConfigError(f"link rate {rate!r} is below 100kbit: the collectives would not finish")
    return value


def payload_share(mtu: int) -> float:
    """The share of a shaped link's rate that carries data: tbf meters whole Ethernet frames, and a
    TCP segment of an MTU-sized packet carries mtu - 52 bytes (IP 20, TCP 20 + 12 of timestamps)
    in a frame of mtu + 14 (Ethernet's header): 1448 / 1514 = 95.6% at MTU 1500. Measured here
    (benchmarks/tbf_probe.py at 100 Mbit/s, back to back; reports/network/tbf-probe/): a 256 KiB send
    21.9 ms, 384 KiB 32.9 ms, against 21.0 and 31.5 ms at the bare rate (+4.6%, 1514 / 1448)."""
    return (mtu - 52) / (mtu + 14)


def tbf_burst_bytes(bits_per_s: float) -> int:
    """tbf's bucket: 1 ms at the rate, at least 128 KiB. A link idle for longer sends that much at
    once (a DDP step's 1.8 MB all-reduce after 40 ms of compute went ~1 MB faster than the rate with
    the old 2-timer-tick bucket at 1 Gbit/s); measured here with commbench at 1 Gbit/s, 128 KiB
    reaches 96% of the rate and 64 KiB only 72% (veth's 64 KB GSO packets)."""
    return max(128 << 10, int(bits_per_s / 8 / 1000))


@dataclass(frozen=True)
class Device:
    name: str                       # its network namespace: n1d0
    addr: str
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Node:
    name: str
    addr: str
    cores: tuple[int, ...]
    devices: tuple[Device, ...] = ()   # empty: the node's ranks share its namespace (one dimension)


@dataclass(frozen=True)
class Plan:
    name: str
    state: str                      # the cluster's directory: configs, logs, pids, its database
    link: str                       # inter-node rate, tc spelling
    nodes: tuple[Node, ...]
    comm_threads: str = "fifo"      # $DDLBENCH_COMM_THREADS inside the cluster (ddlbench/comm/threads.py)
    dev_link: Optional[str] = None  # device <-> node switch rate (devices_per_node >= 2)
    mtu: int = DEFAULT_MTU          # of every link and switch (jumbo frames: 9000)
    head: str = "head"
    head_addr: str = HEAD_ADDR
    ports: dict = field(default_factory=lambda: dict(PORTS))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def devices_per_node(self) -> int:
        return len(self.nodes[0].devices) or 1


def split_cores(cores: list[int], nodes: int) -> list[tuple[int, ...]]:
    """Equal, disjoint shares of the usable cores, in order; the remainder is left unused so
    every node has the same compute."""
    if nodes < 1:
        raise ConfigError("nodes must be >= 1")
    if nodes > len(cores):
        raise ConfigError(f"nodes={nodes} but this machine offers {len(cores)} core(s): each node needs its own core "
                          "(ranks of different nodes never share one)")
    per = len(cores) // nodes
    return [tuple(cores[i * per:(i + 1) * per]) for i in range(nodes)]


def device_cores(node_cores: tuple[int, ...], devices: int) -> list[tuple[int, ...]]:
    """Each device's cores: equal disjoint shares of its node's where there are enough, else every
    device on all of the node's cores (they share them: choose rates where the links, not the
    cores, set the pace)."""
    if len(node_cores) >= devices:
        return split_cores(list(node_cores), devices)
    return [tuple(node_cores)] * devices


def make_plan(nodes: int, link: str, cores: list[int], state: str, name: str = "box",
              comm_threads: str = "fifo", devices_per_node: int = 1, dev_link: Optional[str] = None,
              mtu: int = DEFAULT_MTU) -> Plan:
    rate_bits(link)
    if not 1280 <= mtu <= 65535:
        raise ConfigError(f"mtu={mtu}: between 1280 and 65535 bytes (1500 Ethernet's default, 9000 jumbo frames)")
    if comm_threads not in POLICIES:
        raise ConfigError(f"comm_threads={comm_threads!r}: one of {', '.join(POLICIES)}")
    if nodes > 200:
        raise ConfigError("nodes must be <= 200 (addresses 10.88.0.1-200)")
    if not 1 <= devices_per_node <= 200:
        raise ConfigError(f"devices_per_node={devices_per_node}: between 1 and 200")
    if devices_per_node > 1 and dev_link is None:
        raise ConfigError(f"devices_per_node={devices_per_node} needs dev_link=RATE: the rate of each device's link "
                          "into its node's switch (e.g. dev_link=400mbit)")
    if dev_link is not None:
        if devices_per_node == 1:
            raise ConfigError("dev_link= shapes the links of a node's devices: give devices_per_node >= 2 with it")
        rate_bits(dev_link)
    shares = split_cores(sorted(cores), nodes)

    def node(i: int) -> Node:
        devices = () if devices_per_node == 1 else tuple(
            Device(f"n{i}d{d}", f"{NET}.{i}.{d + 1}", c) for d, c in enumerate(device_cores(shares[i - 1], devices_per_node)))
        return Node(f"n{i}", f"{SUBNET}.{i}", shares[i - 1], devices)
    return Plan(name=name, state=state, link=link, comm_threads=comm_threads, dev_link=dev_link, mtu=mtu,
                nodes=tuple(node(i) for i in range(1, nodes + 1)))


def hosts_file(plan: Plan) -> str:
    """The cluster's /etc/hosts (bind-mounted in its private mount namespace only)."""
    lines = ["127.0.0.1 localhost", f"{plan.head_addr} {plan.head}"]
    lines += [f"{n.addr} {n.name}" for n in plan.nodes]
    lines += [f"{d.addr} {d.name}" for n in plan.nodes for d in n.devices]
    return "\n".join(lines) + "\n"


def slurm_conf(plan: Plan, mem_mb: int) -> str:
    s = plan.state
    nodes = ",".join(n.name for n in plan.nodes)
    out = [
        f"# The emulated cluster {plan.name} (bench cluster): written by ddlbench/cluster/plan.py",
        f"ClusterName={plan.name}",
        f"SlurmctldHost={plan.head}({plan.head_addr})",
        f"SlurmctldPort={plan.ports['slurmctld']}", f"SlurmdPort={plan.ports['slurmd']}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "ReturnToService=2", "SlurmdParameters=config_overrides",
        f"StateSaveLocation={s}/ctld", f"SlurmdSpoolDir={s}/spool/%n",
        f"SlurmctldPidFile={s}/pids/slurmctld.pid", f"SlurmdPidFile={s}/pids/slurmd-%n.pid",
        f"SlurmctldLogFile={s}/logs/slurmctld.log", f"SlurmdLogFile={s}/logs/slurmd-%n.log",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={plan.head}", f"AccountingStoragePort={plan.ports['slurmdbd']}",
        "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=5",
        "MinJobAge=300", "KillWait=5", "InactiveLimit=0",
        # a node whose slurmd does not answer for 30 s is DOWN and its jobs end (NODE_FAIL), as on
        # a real cluster (default 300 s); a node lost mid-run then leaves nothing waiting on it
        "SlurmdTimeout=30",
    ]
    # a node offers a task slot per core, and at least one per device (devices sharing a core)
    out += [f"NodeName={n.name} NodeAddr={n.addr} CPUs={max(len(n.cores), len(n.devices))} RealMemory={mem_mb} "
            "State=UNKNOWN" for n in plan.nodes]
    out.append(f"PartitionName={plan.name} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(out) + "\n"


def slurmdbd_conf(plan: Plan) -> str:
    """slurmdbd in the head's namespaces; its MariaDB listens only on the world's own
    /run/mysqld/mysqld.sock (StorageHost=localhost: the socket), root by unix_socket auth."""
    s = plan.state
    return "\n".join([
        "AuthType=auth/munge",
        f"DbdHost={plan.head}", f"DbdAddr={plan.head_addr}", f"DbdPort={plan.ports['slurmdbd']}",
        "SlurmUser=root", "StorageType=accounting_storage/mysql", "StorageHost=localhost",
        "StorageUser=root", f"StorageLoc={plan.name}_acct_db",
        f"PidFile={s}/pids/slurmdbd.pid", f"LogFile={s}/logs/slurmdbd.log",
    ]) + "\n"


def network_description(plan: Plan) -> dict:
    """conf/network/ form of the cluster (bench project / advise read it): within a node, each
    device's link into the node's switch (shaped at dev_link where the cluster has device
    namespaces; else the ranks share a namespace over an unshaped loopback, 1 GB/s nominal and free),
    across nodes each node's link into the head's switch at the shaped rate: per device, as the
    network model counts bandwidth, the node's D devices share it (rate / D). Latencies are nominal
    until `bench commbench` fits them. Rates are the data a link carries (payload_share of the shaped
    rate); burst_bytes is tbf's bucket in the same bytes (ddlbench/estimate/schedule.py prices it)."""
    per_node = len(plan.nodes[0].cores)
    data = payload_share(plan.mtu)      # bandwidth and burst in the bytes a collective moves, not frames
    if plan.dev_link:
        what = (f"{plan.devices_per_node} devices each, device links {plan.dev_link} into the node's switch, "
                f"node links {plan.link}")
        inner = {"name": "node", "size": plan.devices_per_node, "bandwidth_GBps": rate_bits(plan.dev_link) / 8 / 1e9 * data,
                 "latency_us": 100.0, "cost_per_GBps": 1.0, "burst_bytes": tbf_burst_bytes(rate_bits(plan.dev_link)) * data}
    else:
        what = f"{per_node} core(s) each, veth + bridge at {plan.link}"
        inner = {"name": "node", "size": per_node, "bandwidth_GBps": 1.0, "latency_us": 100.0, "cost_per_GBps": 0.0}
    return {
        "name": f"cluster_{plan.name}",
        "description": (f"bench cluster {plan.name}: {len(plan.nodes)} emulated nodes, {what} (tbf, both "
                        f"directions, MTU {plan.mtu}); latency nominal (not fitted)"),
        "dimensions": [
            inner,
            {"name": "link", "size": len(plan.nodes),
             "bandwidth_GBps": rate_bits(plan.link) / 8 / 1e9 / (plan.devices_per_node if plan.dev_link else 1) * data,
             "latency_us": 100.0, "cost_per_GBps": 1.0, "burst_bytes": tbf_burst_bytes(rate_bits(plan.link)) * data,
             **({"shared": True} if plan.dev_link else {})},
        ],
        "source": "bench cluster up (configured rates)",
    }


def state_dir(name: str) -> Path:
    return Path("/var/tmp/ddlbench-cluster") / name
