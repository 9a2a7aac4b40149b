"""The fork hazard behind "a rank stuck connecting to the agent's store" (ddlbench/launch/forked.py):
a process serves a TCPStore (as torch's elastic agent does) while it forks clients in waves of
`ranks`, each connecting and doing a few store operations, as a forked rank does before its group.

    python benchmarks/fork_store_hazard.py [WAVES] [RANKS]

Prints, for clients that connect at once and for clients that first wait until all of their wave
is forked (`await_siblings`, what ddlbench's ranks do), how many of them hung on a lock (alive after
STUCK_S, asleep in futex_wait) and the slowest wave. DDLBENCH_GDB=1 prints each hung client's native
stack (gdb -p): glibc's resolver lock, `get_locked_global` in resolv/resolv_conf.c. Its holder is
the server thread's reverse lookup of a peer's address (c10d's formatSockAddr: getnameinfo without
NI_NUMERICHOST), an IPv6 one that /etc/hosts does not name, so it goes to DNS; where DNS drops a query
the lock is held the resolver's whole timeout (5 s by default), and the slowest wave shows that
stall even where no client hangs.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

from torch.distributed import TCPStore

from ddlbench.launch.agent import reserve_port
from ddlbench.launch.forked import await_siblings

STUCK_S = 20.0


def client(port: int, wave: int, rank: int, wait: bool, ranks: int) -> None:
    if wait:
        await_siblings(ranks, timeout_s=30)
    c = TCPStore("127.0.0.1", port, is_master=False, use_libuv=True, timeout=datetime.timedelta(seconds=60))
    for i in range(20):
        c.add(f"w{wave}", 1)
        c.set(f"k{wave}_{rank}_{i}", b"x" * 100)
        c.get(f"k{wave}_{rank}_{i}")


def serve_and_fork(waves: int, ranks: int, wait: bool) -> tuple[int, int, float]:
    """In a process of its own (its only children are its clients): how many clients hung on a lock
    (still alive after STUCK_S, asleep in futex_wait), how many were merely slow, and the slowest
    wave's seconds (all of its clients done or killed)."""
    port, held = reserve_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=True,  # noqa: F841
                      timeout=datetime.timedelta(seconds=60))
    held.close()
    locked = slow = 0
    slowest = 0.0
    for w in range(waves):
        t0 = time.monotonic()
        pids = []
        for r in range(ranks):
            pid = os.fork()
            if pid == 0:
                try:
                    client(port, w, r, wait, ranks)
                    os._exit(0)
                except BaseException:  # noqa: BLE001
                    os._exit(3)
            pids.append(pid)
        while pids and time.monotonic() - t0 < STUCK_S:
            pids = [p for p in pids if not os.waitpid(p, os.WNOHANG)[0]]
            time.sleep(0.005)
        for pid in pids:
            with open(f"/proc/{pid}/wchan") as f:
                on_lock = "futex" in f.read()
            locked += on_lock
            slow += not on_lock
            if on_lock and os.environ.get("DDLBENCH_GDB"):
                gdb = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt"], capture_output=True, text=True)
                print("\n".join(line[:160] for line in gdb.stdout.splitlines() if line.startswith("#"))[:4000])
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        slowest = max(slowest, time.monotonic() - t0)
    return locked, slow, slowest


def main() -> None:
    waves = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    for wait in (False, True):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, " ".join(map(str, serve_and_fork(waves, ranks, wait))).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        locked, slow, slowest = os.read(r, 100).decode().split()
        label = "wait for all forked" if wait else "connect at once"
        print(f"{label:>20}: {locked} of {waves * ranks} clients hung on a lock, {slow} others not done in "
              f"{STUCK_S:g} s; slowest wave {float(slowest):.2f} s ({waves} waves of {ranks})", flush=True)


if __name__ == "__main__":
    main()
