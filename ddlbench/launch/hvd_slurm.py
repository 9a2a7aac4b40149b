"""Horovod (gloo controller) in tasks started by `srun`, without horovodrun or MPI.

horovodrun does two things: it assigns every process its slot (rank, local rank, cross rank and
the sizes) and serves a rendezvous over HTTP that gloo uses to connect the ranks. Under srun
the slots come from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_TASKS_PER_NODE)
and rank 0 serves the rendezvous with Horovod's own server, on a port derived from the job and
step (like the torch master port, in another range). Each task then sets the HOROVOD_* variables
horovodrun would have set and calls hvd.init() as usual.

A Horovod built with MPI can instead run under `srun --mpi=pmix` with HOROVOD_CONTROLLER=mpi;
the images build it with gloo (and NCCL on GPU), which this path serves.
"""
from __future__ import annotations

import os
import re
import socket
import time

from ddlbench.errors import ConfigError


def tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE ('2(x3),1' -> [2, 2, 2, 1])."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ConfigError(f"cannot parse SLURM_TASKS_PER_NODE {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slots(counts: list[int]) -> list[dict]:
    """Horovod slots for Slurm's default block distribution: ranks fill node 0, then node 1...
    cross_rank/cross_size: this node's index among the nodes that have this local rank."""
    out, rank = [], 0
    for node, n in enumerate(counts):
        for local in range(n):
            peers = [i for i, c in enumerate(counts) if c > local]
            out.append({"rank": rank, "node": node, "local_rank": local, "local_size": n,
                        "cross_rank": peers.index(node), "cross_size": len(peers), "size": sum(counts)})
            rank += 1
    return out


def rendezvous_port(job_id: int, step_id: int) -> int:
    """In [40000, 60000): apart from the torch master ports (ddlbench.launch.slurm.master_port)."""
    return 40000 + (job_id * 31 + step_id) % 20000


def _iface_towards(addr: str) -> str:
    """The network interface this host uses to reach `addr` (gloo binds to one interface)."""
    import psutil
    ip = socket.gethostbyname(addr)
    if ip.startswith("127."):
        return "lo"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        local_ip = s.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == local_ip for a in addrs):
            return name
    raise ConfigError(f"no network interface has the address {local_ip} used to reach {addr}")


def horovod_env(environ, master_addr: str) -> dict:
    """HOROVOD_* for this task, checked against what Slurm says about it."""
    counts = tasks_per_node(environ.get("SLURM_TASKS_PER_NODE", environ["SLURM_NTASKS"]))
    table = slots(counts)
    rank = int(environ["SLURM_PROCID"])
    if len(table) != int(environ["SLURM_NTASKS"]):
        raise ConfigError(f"SLURM_TASKS_PER_NODE {counts} does not add up to SLURM_NTASKS {environ['SLURM_NTASKS']}")
    me = table[rank]
    if (me["local_rank"], me["node"]) != (int(environ.get("SLURM_LOCALID", 0)), int(environ.get("SLURM_NODEID", 0))):
        raise ConfigError("Horovod under srun needs Slurm's block task distribution (srun --distribution=block)")
    step = environ.get("SLURM_STEP_ID", "0")
    return {
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": master_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port(int(environ["SLURM_JOB_ID"]), int(step) if step.isdigit() else 0)),
        "HOROVOD_GLOO_IFACE": environ.get("HOROVOD_GLOO_IFACE") or _iface_towards(master_addr),
        "HOROVOD_HOSTNAME": f"node{me['node']}",
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(me["size"]),
        "HOROVOD_LOCAL_RANK": str(me["local_rank"]), "HOROVOD_LOCAL_SIZE": str(me["local_size"]),
        "HOROVOD_CROSS_RANK": str(me["cross_rank"]), "HOROVOD_CROSS_SIZE": str(me["cross_size"]),
    }


class Rendezvous:
    """Rank 0: Horovod's HTTP rendezvous server with the slot table. Other ranks: wait until it
    accepts connections (gloo gives up quickly on a refused connection)."""

    def __init__(self, env: dict, timeout_s: float = 120):
        self.server = None
        addr, port = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        if env["HOROVOD_RANK"] == "0":
            from horovod.runner.common.util.hosts import SlotInfo
            from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
            from horovod.runner.util.threads import in_thread
            counts = tasks_per_node(os.environ.get("SLURM_TASKS_PER_NODE", env["HOROVOD_SIZE"]))
            plan = [SlotInfo(hostname=f"node{s['node']}", rank=s["rank"], local_rank=s["local_rank"],
                             cross_rank=s["cross_rank"], size=s["size"], local_size=s["local_size"],
                             cross_size=s["cross_size"]) for s in slots(counts)]
            self.server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
            self.server.init(plan)
            self.thread = in_thread(target=self.server.serve_forever)
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((addr, port), timeout=2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise ConfigError(f"Horovod rendezvous at {addr}:{port} (rank 0) not reachable "
                                      f"after {timeout_s:.0f} s") from None
                time.sleep(0.2)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
