"""Horovod's ranks forked on CPU, as every other framework's are (ddlbench/launch/forked.py).

horovodrun still starts one command per slot, with the slot's HOROVOD_* environment and its output
pipes. That command is a small client (ddlbench/launch/hvd_shim.py: a fresh interpreter that
imports nothing of torch), which hands its environment, working directory and standard streams
over a Unix socket to this server; the server, which has already imported the runner and the
model's library, forks the rank with them, tells the client the rank's pid (signals the client
gets go on to the rank) and, when the rank ends, its exit status (the client's own). A spawned
Horovod rank imported torch and transformers itself: ~9 CPU-s per rank on a 2-core VM, a start-up
no other framework's forked ranks paid.

Process tree: the launcher forks a session leader (`serve_horovodrun`) that runs horovodrun as its
child and serves; ranks are forked from the leader, so they are in its process group and a signal
to the group (the launcher's stack dump, Slurm's time-limit warning, a kill) reaches them as it
reaches the elastic agent's ranks. A rank whose client dies (horovodrun ended its command) is
killed; when horovodrun exits, every rank still running is killed.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import struct
import subprocess

from ddlbench.launch.forked import Forked, freeze_for_forked_ranks
from ddlbench.rank.gcpolicy import INHERITED_FROZEN_ENV

STREAMS = 3                       # the client's stdin, stdout, stderr
_LENGTH = struct.Struct("!I")


def address() -> str:
    """An abstract Unix socket name (no file, gone with its last holder), unique to this launch."""
    return f"ddlbench-hvd-{os.getpid()}-{secrets.token_hex(6)}"


def _bind(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(64)
    return sock


def send_request(sock: socket.socket, env: dict, cwd: str, argv: list[str]) -> None:
    """Client side: its standard streams (SCM_RIGHTS; /dev/null for one it lacks), then what the
    rank starts with."""
    fds = []
    for fd in range(STREAMS):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    socket.send_fds(sock, [b"r"], fds)
    body = json.dumps({"env": env, "cwd": cwd, "argv": argv}).encode()
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the client closed its connection mid-request")
        buf += chunk
    return buf


def receive_request(conn: socket.socket) -> tuple[list[int], dict]:
    """Server side: the client's streams (fds now this process's) and its request."""
    _, fds, _, _ = socket.recv_fds(conn, 1, STREAMS)
    if len(fds) != STREAMS:
        for fd in fds:
            os.close(fd)
        raise ConnectionError(f"the client passed {len(fds)} file descriptors, not {STREAMS}")
    (length,) = _LENGTH.unpack(_read_exactly(conn, _LENGTH.size))
    return fds, json.loads(_read_exactly(conn, length))


def horovod_worker(argv: list[str]) -> int:
    from ddlbench.launch import hvd_worker
    run_dir, threads = argv
    return hvd_worker.main(run_dir, int(threads))


def _rank(fds: list[int], request: dict, close: list[int], worker) -> int:
    """In the forked rank: the client's environment, directory and streams; then `worker(argv)`."""
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    os.dup2(fds[0], 0)
    for fd in fds:
        os.close(fd)
    frozen = os.environ.get(INHERITED_FROZEN_ENV)     # what this rank inherited frozen (the server's count)
    os.environ.clear()
    os.environ.update(request["env"])
    if frozen:
        os.environ[INHERITED_FROZEN_ENV] = frozen
    os.chdir(request["cwd"])
    return worker(request["argv"])


class Served:
    """One client and the rank forked for it."""

    def __init__(self, conn: socket.socket, listening: socket.socket, others: list[socket.socket], worker):
        self.conn = conn
        conn.settimeout(30)      # the client sends its request at once
        fds, request = receive_request(conn)
        try:
            close = [listening.fileno(), conn.fileno(), *(o.fileno() for o in others)]
            self.rank = Forked(lambda: _rank(fds, request, close, worker), stdout=fds[1], stderr=fds[2])
        finally:
            for fd in fds:
                os.close(fd)
        conn.settimeout(None)
        conn.sendall(f"pid {self.rank.pid}\n".encode())

    def fileno(self) -> int:
        return self.conn.fileno()

    def finished(self) -> bool:
        """True once the rank has exited and the client has been told how."""
        code = self.rank.poll()
        if code is None:
            return False
        with contextlib.suppress(OSError):
            self.conn.sendall(f"exit {code}\n".encode())
        self.conn.close()
        return True

    def kill(self) -> None:
        if self.rank.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.rank.pid, signal.SIGKILL)
            self.rank.wait()
        self.conn.close()


def serve_horovodrun(cmd: list[str], env: dict, name: str, worker=horovod_worker, poll_s: float = 0.05) -> int:
    """The session leader: horovodrun as a child (same process group), its commands' ranks forked
    here on request (each runs `worker(argv)`, argv the client's after the address); horovodrun's exit
    code once it ends."""
    # Slurm's time-limit warning (forwarded to the whole group) and the launcher's stack dump are
    # for the ranks: horovodrun and this leader must outlive them (as the elastic agent does)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    freeze_for_forked_ranks()
    listening = _bind(name)
    served: list[Served] = []
    hvd = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    try:
        while True:
            served = [s for s in served if not s.finished()]
            code = hvd.poll()
            if code is not None:
                return code
            readable, _, _ = select.select([listening, *served], [], [], poll_s)
            for r in readable:
                if r is listening:
                    conn, _ = listening.accept()
                    try:
                        served.append(Served(conn, listening, [s.conn for s in served], worker))
                    except (OSError, ConnectionError, ValueError) as exc:
                        print(f"bench: a Horovod command's request failed: {exc}", flush=True)
                        conn.close()
                elif not r.conn.recv(1):      # the client is gone (horovodrun ended it): so is its rank
                    r.kill()
                    served.remove(r)
    finally:
        for s in served:
            s.kill()
        if hvd.poll() is None:
            hvd.kill()
            hvd.wait()
        listening.close()
