"""Failure classification of a launch, in one place: which rank to blame (the root cause, not the
peers that lost their connection to it), and the failure record the agent writes for the
launcher (failure.json). Used by the agent, the ranks (ddlbench.launch.worker) and the launcher
(ddlbench.launch.local)."""
from __future__ import annotations

# a rank that fails *because* a peer died or closed its connection is not the root cause
LOST_PEER_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe",
                     "connection refused", "socket closed")


def _message(failure) -> tuple[str | None, str | None]:
    """(message, traceback) from a failure's error file, if it wrote one."""
    data = failure.error_file_data or {}
    msg = data.get("message", {}) if isinstance(data, dict) else {}
    message = msg.get("message") if isinstance(msg, dict) else str(msg)
    traceback = (msg.get("extraInfo") or {}).get("py_callstack") if isinstance(msg, dict) else None
    return message, traceback


def is_lost_peer(message: str | None) -> bool:
    return bool(message) and any(m in message.lower() for m in LOST_PEER_MARKERS)


def root_cause(failures: dict) -> int:
    """The rank to blame: the earliest failure that is not a lost-peer error (a rank killed by a
    signal, or one that raised for its own reason), else the earliest. torch elastic's own
    choice is the earliest timestamp alone, in whole seconds: a SIGKILLed rank's peer, failing
    with 'Connection closed by peer' in the same second, was often named instead."""
    def key(rank):
        f = failures[rank]
        return (is_lost_peer(_message(f)[0]), f.timestamp, rank)
    return min(failures, key=key)


def describe_failure(exc) -> dict:
    """ChildFailedError -> {rank, exitcode, signal, message, traceback, ranks_failed}."""
    rank = root_cause(exc.failures)
    failure = exc.failures[rank]
    message, traceback = _message(failure)
    if not message:
        message = (f"rank {rank} exited with code {failure.exitcode}"
                   + (f" ({failure.signal_name()})" if failure.exitcode < 0 else ""))
    return {
        "rank": rank,
        "exitcode": failure.exitcode,
        "signal": failure.signal_name() if failure.exitcode < 0 else None,
        "message": message,
        "traceback": traceback[-4000:] if traceback else None,
        "ranks_failed": sorted(exc.failures),
    }
