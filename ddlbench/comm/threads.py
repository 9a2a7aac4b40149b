"""Communication threads first on `bench cluster`'s one-core nodes ($DDLBENCH_COMM_THREADS).

On a node whose one core runs a rank's compute and gloo's threads (gloo_tcp_loop, which moves the
bytes, and pt_gloo_runloop, which runs each collective), the fair scheduler lets gloo's threads
wait behind each other and behind compute: at 10 Gbit/s a 256 KiB all-reduce after 50 ms of
compute took 5.6 ms, its threads waiting runnable 5.5 ms an op, against 0.6 ms for the same bytes
over plain TCP between the nodes (benchmarks/cluster_host_probe.py). `fifo` makes those threads
SCHED_FIFO: they run when they have work, as a real node's communication runs beside its compute
(NIC, NCCL's kernels and proxy threads on their own cores): 0.9 ms. nice -20 did not do it
(3.8 ms). `bench cluster up` sets `fifo` by default (comm_threads=fair to leave the threads as
they are); the runner and commbench apply it once the collectives' threads exist, and
result.json records the policy and the threads it moved (env.comm_threads).

Not for point-to-point: with gloo's threads FIFO a send/recv pair stalled exactly 1 s (a lost
wake-up caught by a timed wait), so a run with pipeline stages keeps `fair` and says so, and
commbench puts the threads back before its `send` rows.
"""
from __future__ import annotations

import os
from pathlib import Path

from ddlbench.errors import ConfigError

ENV = "DDLBENCH_COMM_THREADS"
POLICIES = ("fair", "fifo")
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")
P2P_NOTE = (f"{ENV}=fifo not applied: this run sends point to point (pipeline stages), where gloo's "
            "send/recv stalled 1 s with FIFO threads; its communication threads were left to the fair scheduler")


def policy(environ=os.environ) -> str:
    """The policy asked for: $DDLBENCH_COMM_THREADS, 'fair' (the scheduler's default) if unset."""
    value = environ.get(ENV) or "fair"
    if value not in POLICIES:
        raise ConfigError(f"{ENV}={value!r}: one of {', '.join(POLICIES)}")
    return value


def selected(threads: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The communication threads among (tid, name): gloo's (the kernel keeps 15 characters of a
    thread's name; both of these fit)."""
    return [(tid, name) for tid, name in threads if name.startswith(GLOO_THREADS)]


def threads() -> list[tuple[int, str]]:
    """(tid, name) of this process's threads."""
    out = []
    for t in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            out.append((int(t), Path(f"/proc/self/task/{t}/comm").read_text().strip()))
        except OSError:      # the thread ended meanwhile
            pass
    return out


def _set(scheduler: int, priority: int) -> list[str]:
    moved = []
    for tid, name in selected(threads()):
        try:
            os.sched_setscheduler(tid, scheduler, os.sched_param(priority))
        except ProcessLookupError:
            continue
        moved.append(name)
    return moved


def apply(environ=os.environ, p2p: bool = False) -> dict:
    """Apply the policy to this process's communication threads (those that exist now; again is
    harmless). What was done, for the record: {"policy", "threads": names moved, "note"?}."""
    want = policy(environ)
    if want == "fair":
        return {"policy": "fair", "threads": []}
    if p2p:
        return {"policy": "fair", "threads": [], "note": P2P_NOTE}
    try:
        return {"policy": want, "threads": _set(os.SCHED_FIFO, 1)}
    except PermissionError as exc:
        return {"policy": "fair", "threads": [],
                "note": f"{ENV}=fifo needs root or CAP_SYS_NICE ({exc}); threads left to the fair scheduler"}


def reset() -> list[str]:
    """Every communication thread back to the fair scheduler."""
    return _set(os.SCHED_OTHER, 0)
