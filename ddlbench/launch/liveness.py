"""Which node was lost, told from the ranks that survive it.

A collective that times out says only that some peer stopped answering; across nodes the rank
that notices is usually on a healthy node. So every rank of a multi-rank run opens a beacon (a
listening TCP socket that accepts and closes) and the ranks exchange (host, port) when the
process group forms. When a rank fails it knocks on every peer's beacon: `up` (the process
answers), `refused` (the host answers, the process is gone) or `unreachable` (nothing answers),
and looks at its own interfaces. A node is lost when none of its ranks can be reached from a
rank whose own network is up; a rank whose every interface is down names its own node. On both
sides of a dead link the verdict is the same node.
"""
from __future__ import annotations

import fcntl
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40

_peers: list[tuple[str, str, int]] = []     # rank -> (host, address, beacon port), once exchanged
_me: Optional[int] = None
_beacon: Optional[socket.socket] = None


def _accept_forever(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.close()


def start(rank: int) -> list[str]:
    """Open this rank's beacon and exchange every rank's (host, address, port): a collective,
    called by every rank right after the process group forms. Returns every rank's host (the
    RankContext carries them: the one exchange of hosts in a run)."""
    import torch.distributed as dist
    global _beacon, _me
    _beacon = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _beacon.bind(("0.0.0.0", 0))
    _beacon.listen(64)
    threading.Thread(target=_accept_forever, args=(_beacon,), daemon=True, name="liveness-beacon").start()
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = "127.0.0.1"
    table: list = [None] * dist.get_world_size()
    dist.all_gather_object(table, (host, addr, _beacon.getsockname()[1]))
    _peers[:] = [tuple(t) for t in table]
    _me = rank
    return [t[0] for t in _peers]


def knock(addr: str, port: int, timeout_s: float) -> str:
    """'up', 'refused' or 'unreachable' for one beacon."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return "up"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"


def own_network_up() -> bool:
    """Whether any interface of this network namespace other than loopback is up with a carrier
    (read through a socket, so it is this process's namespace, not the one /sys was mounted in)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS,
                                                       struct.pack("256s", name.encode()[:15]))[16:18])[0]
            except OSError:
                continue
            if flags & IFF_UP and flags & IFF_RUNNING:
                return True
    return False


def lost_nodes(hosts: list[str], status: list[str], me: int, network_up: bool) -> list[str]:
    """The nodes lost, from rank `me`'s view: status[r] of every rank ('self' for me). Its own
    node when its network is down; else every other node none of whose ranks answers."""
    if not network_up:
        return [hosts[me]]
    seen: dict[str, list[str]] = {}
    for host, st in zip(hosts, status):
        if host != hosts[me]:
            seen.setdefault(host, []).append(st)
    return [h for h, sts in seen.items() if all(s == "unreachable" for s in sts)]


def diagnose(timeout_s: float = 3.0) -> Optional[dict]:
    """After a failure: every peer's state, this node's network, the lost nodes (None before the
    beacons were exchanged, or in a 1-rank run)."""
    if _me is None or len(_peers) < 2:
        return None
    others = [r for r in range(len(_peers)) if r != _me]
    with ThreadPoolExecutor(min(64, len(others))) as pool:     # a large world: 64 knocks at a time
        answers = dict(zip(others, pool.map(lambda r: knock(_peers[r][1], _peers[r][2], timeout_s), others)))
    status = [answers.get(r, "self") for r in range(len(_peers))]
    up = own_network_up()
    hosts = [p[0] for p in _peers]
    return {"peers": status, "hosts": hosts, "network_up": up, "lost_nodes": lost_nodes(hosts, status, _me, up)}


def summary(d: dict) -> str:
    """One clause for the failure message."""
    me = d["peers"].index("self")
    if not d["network_up"]:
        return f"node {d['hosts'][me]} lost: its own network is down (no interface up)"
    if d["lost_nodes"]:
        return (f"node(s) {', '.join(d['lost_nodes'])} lost: no rank there answers from {d['hosts'][me]}")
    gone = [str(r) for r, s in enumerate(d["peers"]) if s == "refused"]
    return f"rank(s) {', '.join(gone)} exited (their hosts answer)" if gone else "every peer still answers"
