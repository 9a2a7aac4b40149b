"""The elastic agent: forked by ddlbench.launch.local into its own session (so a timeout can kill
the whole tree), or `python -m ddlbench.launch.agent RUN_DIR NPROC THREADS [MONITOR_S [START]]`.

Runs torch's elastic launch API with torchrun semantics: a static rendezvous on a free loopback
port, `launcher.max_restarts` restarts of the whole worker group (torchrun's --max-restarts; 0 by
default: a failed rank ends the run), ranks forked (CPU: they inherit the launcher's imports) or spawned (CUDA; see
ddlbench.launch.forked). When a rank fails, the agent stops the others and writes failure.json
(first failure: rank, exit code, signal, message, traceback) for the launcher. With restarts left it
starts them all again instead (TORCHELASTIC_RESTART_COUNT counts the attempts; the ranks resume from the
newest complete save, ddlbench/rank/saves.py), and the moment it saw the failure goes on the run's
timeline as `failure_detected` (torch elastic's own metric, emitted as its monitor loop sees the group
fail).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path

from ddlbench.launch.failures import describe_failure
from ddlbench.launch.forked import freeze_for_forked_ranks
from ddlbench.lifecycle import events
from ddlbench.rank.gcpolicy import INHERITED_FROZEN_ENV
from ddlbench.record.results import atomic_write_json
from ddlbench.record.rundir import RunDir


def reserve_port() -> tuple[int, socket.socket]:
    """A free loopback port and a socket that keeps it: bound with SO_REUSEADDR and never listening,
    so no other process is handed the port (another bind to port 0, a connection's own port) while
    torch's TCPStore, which binds with SO_REUSEADDR, can still listen on it. Keep the socket open until
    the store is up (the run's end will do). Choosing a free port and closing it left a window before
    the store's bind in which another process may take it: seen as EADDRINUSE at rank 0's
    TCPStore with two test workers starting runs side by side."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1], s


def main(argv: list[str]) -> int:
    return launch(Path(argv[0]), int(argv[1]), int(argv[2]), float(argv[3]) if len(argv) > 3 else 0.25,
                  argv[4] if len(argv) > 4 else "spawn", int(argv[5]) if len(argv) > 5 else 0)


class FailureClock:
    """torch elastic's metric handler: its monitor loop emits `workers.<role>.failed` (or `unhealthy`)
    when it sees the worker group fail, before it restarts or stops it; that moment is marked on the
    run's timeline (failure_detected, with the attempt that failed)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.attempt = run_dir, 0

    def emit(self, data) -> None:
        name = data.name.rsplit(".", 1)[-1]
        if name in ("failed", "unhealthy"):
            events.mark(self.run_dir, "failure_detected", t=data.timestamp, attempt=self.attempt, state=name)
            self.attempt += 1


def launch(run_dir: Path, nproc: int, threads: int, monitor: float, start_method: str, max_restarts: int = 0) -> int:
    from torch.distributed.elastic import metrics
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddlbench.launch.worker import rank_main

    events.mark(run_dir, "agent_start", start_method=start_method)
    if max_restarts:
        metrics.configure(FailureClock(run_dir), "torchelastic")
    # SIGUSR1 (time-limit warning) reaches the agent's whole group: the ranks save their series
    # and exit, and the agent must outlive them, so the launcher reads complete partial files
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # SIGUSR2 (the launcher's stack dump before a timeout kill) is for the ranks, not the agent
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    # The agent's own chatter goes to the run's log, not the user's terminal.
    handler = logging.FileHandler(RunDir(run_dir).agent_log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.propagate = False
        lg.setLevel(logging.INFO)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # spawned ranks' libgomp reads it at import
                                                  # (forked ones: torch.set_num_threads in the rank)
    port, held = reserve_port()     # held for the run: this process lives until its ranks end
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=run_dir.name,
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{port}", rdzv_configs={"rank": 0},
        max_restarts=max_restarts, monitor_interval=monitor, start_method=start_method,
        # rank 0 keeps the terminal (progress bar); the others log to files
        logs_specs=DefaultLogsSpecs(log_dir=str(RunDir(run_dir).logs),
                                    redirects={r: Std.ALL for r in range(1, nproc)}),
    )
    if start_method == "fork":      # forked ranks start from this heap frozen (ddlbench/launch/forked.py)
        freeze_for_forked_ranks()
    else:
        os.environ.pop(INHERITED_FROZEN_ENV, None)
    try:
        elastic_launch(config, rank_main)(str(run_dir), threads)
    except ChildFailedError as exc:
        atomic_write_json(RunDir(run_dir).failure, describe_failure(exc))
        return 1
    except SignalException as exc:    # the launcher stops the run (and writes its result): no traceback
        return 128 + int(exc.sigval)
    finally:
        held.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
