"""Building and tearing down the emulated cluster's world.

Everything lives in a private mount + network namespace made by `unshare -m -n` (the "world"):
its own /run/netns (a tmpfs) for the node namespaces, its own /etc/hosts (a bind mount of the
cluster's hosts file), and the namespaces head, n1, n2, ... joined by a bridge in head. The
machine's own interfaces, addresses, routes and files are never touched; the world exists as
long as a process lives in it (the daemons), and `down` ends every process whose mount
namespace is the world's, after which the kernel removes the namespaces, veths and qdiscs.

Daemons enter their node with `nsenter --net=/run/netns/X` (not `ip netns exec`, which remounts
/sys and hides the cgroup tree slurmd needs) and `unshare -u` for their own hostname; `ip netns
exec` only writes each link's receive steering into its namespace's /sys (`steer`).
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from ddlbench.cluster.plan import DEFAULT_MTU, PREFIX, Node, Plan, rate_bits, tbf_burst_bytes

SLURM_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "srun", "sacct")
TOOLS = ("unshare", "nsenter", "ip", "tc", "taskset")


def tbf(ns: str, dev: str, rate: str) -> str:
    bits = rate_bits(rate)
    return (f"tc -n {ns} qdisc replace dev {dev} root tbf rate {int(bits)}bit burst {tbf_burst_bytes(bits)} "
            "latency 100ms")


def mtu(ns: str, devs: list[str], plan: Plan) -> list[str]:
    """The plan's MTU on these links and switches (none where it is the kernel's own 1500)."""
    return [] if plan.mtu == DEFAULT_MTU else [f"ip -n {ns} link set dev {d} mtu {plan.mtu}" for d in devs]


def cpu_mask(cores) -> str:
    """rps_cpus' hex mask of the given cores ([0] -> '1', [1, 2] -> '6'), in the kernel's bitmap
    spelling: 32-bit groups of 8 hex digits, comma-separated, past core 31 ([32] -> '1,00000000')."""
    digits = format(sum(1 << c for c in cores), "x")
    groups = [digits[max(0, i - 8):i] for i in range(len(digits), 0, -8)][::-1]
    return ",".join([groups[0]] + [g.zfill(8) for g in groups[1:]])


def steer(ns: str, dev: str, cores) -> str:
    """Receive packet steering: every packet `dev` receives is processed on `cores` (one queue,
    so in order). Without it a veth hands each packet to the backlog of whichever CPU sent it on
    (the sending process's, or the one where tbf's timer fired), the two CPUs process a flow's
    packets side by side, and TCP sees them out of order: at 10 Gbit/s 1-2% of segments were
    retransmitted (fast retransmits, then undone by duplicate SACKs), none with steering. Skipped
    on a kernel without RPS (no rps_cpus file)."""
    f = f"/sys/class/net/{dev}/queues/rx-0/rps_cpus"
    return f"ip netns exec {ns} sh -c '[ ! -e {f} ] || echo {cpu_mask(cores)} > {f}'"


def build_script(plan: Plan) -> str:
    """The bash script run inside the world: network, then munged, MariaDB, slurmdbd, slurmctld,
    one slurmd per node (each on its node's cores). Fails on the first error (`set -e`)."""
    s = shlex.quote(plan.state)
    conf = f"SLURM_CONF={s}/slurm.conf"
    lines = [
        "set -euo pipefail",
        # the world's own /run: /run/netns for the node namespaces, /run/munge and /run/mysqld for
        # its munged and MariaDB at their default paths (the machine's /run is not touched)
        "mount -t tmpfs -o size=16m,mode=755 none /run",
        "mkdir -p /run/netns /run/munge /run/mysqld",
        f"mount --bind {s}/hosts /etc/hosts",
        "ip link set lo up",
        f"ip netns add {plan.head}",
        f"ip -n {plan.head} link set lo up",
        f"ip -n {plan.head} link add br0 type bridge",
        *mtu(plan.head, ["br0"], plan),
        f"ip -n {plan.head} addr add {plan.head_addr}/{PREFIX} dev br0",
        f"ip -n {plan.head} link set br0 up",
    ]
    for n in plan.nodes:
        lines += node_network(plan, n)
    head = f"nsenter --net=/run/netns/{plan.head}"
    lines += [
        # munge with the cluster's own key and socket
        f"munged --force --key-file={s}/munge/munge.key "
        f"--pid-file={s}/pids/munged.pid --log-file={s}/logs/munged.log --seed-file={s}/munge/seed",
        # MariaDB on the world's /run/mysqld/mysqld.sock only (no network): slurmdbd, as root,
        # logs in as root through the socket (unix_socket authentication)
        f"[ -d {s}/mysql/mysql ] || mariadb-install-db --no-defaults --user=root --datadir={s}/mysql "
        f"--skip-test-db > {s}/logs/mariadb-install.log 2>&1",
        f"setsid mariadbd --no-defaults --user=root --datadir={s}/mysql --socket=/run/mysqld/mysqld.sock "
        f"--skip-networking --pid-file={s}/pids/mariadbd.pid > {s}/logs/mariadbd.log 2>&1 < /dev/null &",
        "for _ in $(seq 1 60); do mariadb --no-defaults -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done",
        # slurmdbd reads slurmdbd.conf beside SLURM_CONF's slurm.conf
        f"{head} unshare -u sh -c 'hostname {plan.head}; exec env {conf} slurmdbd'",
        f"for _ in $(seq 1 60); do {head} bash -c 'exec 3<>/dev/tcp/{plan.head_addr}/{plan.ports['slurmdbd']}' 2>/dev/null "
        "&& break; sleep 0.5; done",
        f"{head} env {conf} sacctmgr -i add cluster {plan.name} > {s}/logs/sacctmgr.log 2>&1",
        f"{head} unshare -u sh -c 'hostname {plan.head}; exec env {conf} slurmctld -i'",
    ]
    for n in plan.nodes:
        cores = ",".join(map(str, n.cores))
        lines.append(f"nsenter --net=/run/netns/{n.name} unshare -u sh -c "
                     f"'hostname {n.name}; exec env {conf} taskset -c {cores} slurmd -N {n.name}'")
    return "\n".join(lines) + "\n"


def node_network(plan: Plan, n: Node) -> list[str]:
    """A node's namespace and its link into the head's switch, shaped at the inter-node rate both
    ways; with devices, the node's own switch (a bridge holding the node's address, where slurmd
    listens), the uplink a port of it, and one namespace per device linked to it at dev_link."""
    v = f"v{n.name}"
    up = "up0" if n.devices else "eth0"        # the node's end of its uplink
    lines = [
        f"ip netns add {n.name}",
        f"ip -n {n.name} link set lo up",
        f"ip -n {plan.head} link add {v} type veth peer name {up} netns {n.name}",
        f"ip -n {plan.head} link set {v} master br0 up",
    ]
    lines += mtu(plan.head, [v], plan) + mtu(n.name, [up], plan)
    if n.devices:
        lines += [f"ip -n {n.name} link add brn type bridge", *mtu(n.name, ["brn"], plan),
                  f"ip -n {n.name} addr add {n.addr}/{PREFIX} dev brn",
                  f"ip -n {n.name} link set brn up", f"ip -n {n.name} link set {up} master brn up"]
    else:
        lines += [f"ip -n {n.name} addr add {n.addr}/{PREFIX} dev {up}", f"ip -n {n.name} link set {up} up"]
    lines += [
        tbf(n.name, up, plan.link),                  # node -> switch
        tbf(plan.head, v, plan.link),                # switch -> node
        steer(n.name, up, n.cores),                  # what the node receives: on its own cores
        steer(plan.head, v, n.cores),                # what it sends, through the switch: on its cores
    ]
    for i, d in enumerate(n.devices):
        port = f"d{i}"                               # the node switch's end of the device's link
        lines += [
            f"ip netns add {d.name}",
            f"ip -n {d.name} link set lo up",
            f"ip -n {n.name} link add {port} type veth peer name eth0 netns {d.name}",
            *mtu(n.name, [port], plan), *mtu(d.name, ["eth0"], plan),
            f"ip -n {n.name} link set {port} master brn up",
            f"ip -n {d.name} addr add {d.addr}/{PREFIX} dev eth0",
            f"ip -n {d.name} link set eth0 up",
            tbf(d.name, "eth0", plan.dev_link),      # device -> node switch
            tbf(n.name, port, plan.dev_link),        # node switch -> device
            steer(d.name, "eth0", d.cores),
            steer(n.name, port, d.cores),
        ]
    return lines


def preflight() -> str | None:
    """Why this machine or user cannot build the cluster (one line), or None."""
    import shutil
    if os.geteuid() != 0:
        return "bench cluster needs root (network namespaces, veth pairs, tc)"
    missing = [t for t in (*TOOLS, *SLURM_BINARIES) if shutil.which(t) is None]
    if missing:
        return (f"bench cluster: missing {', '.join(missing)} (Debian: apt-get install slurmctld slurmd slurmdbd "
                "slurm-client munge mariadb-server iproute2; `bash scripts/slurm_local.sh install` installs them)")
    probe = ("ip link add ddlb0 type veth peer name ddlb1 && ip link set ddlb0 up && "
             "tc qdisc add dev ddlb0 root tbf rate 1mbit burst 32kb latency 50ms")
    try:
        proc = subprocess.run(["unshare", "-n", "sh", "-c", probe], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "bench cluster: probing network namespaces timed out"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"bench cluster: this kernel cannot make a network namespace with a tbf qdisc ({why})"
    return None


def world_mnt(pid: int) -> str | None:
    """The mount namespace of a process ('mnt:[4026532...]'), or None if it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def processes_in(mnt: str) -> list[int]:
    """Every process whose mount namespace is `mnt` (the world's daemons and their children)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and world_mnt(int(d.name)) == mnt:
            out.append(int(d.name))
    return out


def end_world(mnt: str, grace_s: float = 10.0, reap_s: float = 30.0) -> list[int]:
    """SIGTERM every process of the world, then SIGKILL what is left, then wait until each of them
    is gone from /proc: an ended daemon stays a zombie (still listed by `pgrep`) until its parent,
    the machine's init once it has daemonised, reaps it. Returns the pids still there after that
    (none, or something unkillable or not reaped within reap_s)."""
    seen: dict[int, str | None] = {}    # pid -> its start time: a pid reused meanwhile is not waited for
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = processes_in(mnt)
        seen.update({p: started(p) for p in pids if p not in seen})
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while processes_in(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not processes_in(mnt):
            break
    left = processes_in(mnt)
    if left:
        return left
    deadline = time.monotonic() + reap_s
    while (present := [p for p, t in seen.items() if t is not None and started(p) == t]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    return present


def started(pid: int) -> str | None:
    """A process's start time (/proc/PID/stat field 22, clock ticks since boot), zombies included;
    None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if world_mnt(pid) else None
