"""Launch mechanics without a run: how ranks are started (fork on CPU, spawn on CUDA), the
start-up timeline's arithmetic, and the forked-child handle the launchers wait on."""
import os
import signal
import subprocess
import sys
import time

import pytest

from ddlbench.launch.forked import Forked, await_siblings, children_of, rank_start_method, scan_children
from ddlbench.launch.local import start_method
from ddlbench.lifecycle import events
from ddlbench.planning.config import plan_from_overrides


def test_ranks_are_forked_on_cpu_and_spawned_on_cuda():
    assert rank_start_method("cpu") == "fork"
    assert rank_start_method("cuda") == "spawn"   # a forked child cannot use a driver its parent touched
    plan = plan_from_overrides(["launcher.nproc=2"])
    assert plan.cfg.launcher.start_method == "auto"
    assert start_method(plan, "cpu") == "fork" and start_method(plan, "cuda") == "spawn"
    forced = plan_from_overrides(["launcher.start_method=spawn"])
    assert start_method(forced, "cpu") == "spawn"


def test_a_start_method_that_does_not_exist_is_a_config_error():
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="launcher.start_method"):
        plan_from_overrides(["launcher.start_method=thread"])


def test_phases_end_when_the_slowest_process_reaches_each_event(tmp_path):
    t = 1000.0
    for ev, rank, dt in [("cli_start", None, 0.0), ("validated", None, 0.5), ("agent_start", None, 0.75),
                         ("rank_start", 0, 1.0), ("rank_start", 1, 1.25), ("process_group", 1, 1.5),
                         ("process_group", 0, 1.5), ("model_ready", 0, 2.0), ("model_ready", 1, 2.5),
                         ("first_step", 1, 3.0), ("first_step", 0, 3.25)]:
        events.mark(tmp_path, ev, rank, t=t + dt, **({"start_method": "fork"} if ev == "agent_start" else {}))
    got = events.phases(events.read(tmp_path))
    assert got == {"cli_parse_validate": 0.5, "agent_start": 0.25, "rank_start": 0.5, "process_group": 0.25,
                   "model_build": 1.0, "first_step": 0.75, "total_to_first_step": 3.25}
    assert events.info(events.read(tmp_path), "agent_start", "start_method") == "fork"
    assert events.phases([e for e in events.read(tmp_path) if e["event"] != "first_step"]) is None


def test_process_start_time_is_before_now():
    import time
    assert 0 <= time.time() - events.process_start_time() < 24 * 3600


def test_forked_child_exit_codes_exceptions_and_signals():
    assert Forked(lambda: 3).wait(timeout=30) == 3
    assert Forked(lambda: None).wait(timeout=30) == 0
    assert Forked(lambda: sys.exit(2)).wait(timeout=30) == 2
    err = os.open(os.devnull, os.O_WRONLY)
    try:
        assert Forked(lambda: 1 / 0, stderr=err).wait(timeout=30) == 1   # traceback, exit 1, never returns
    finally:
        os.close(err)
    sleeper = Forked(lambda: signal.pause())
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)
    assert sleeper.poll() is None
    sleeper.send_signal(signal.SIGUSR1)       # the parent's handlers are reset in the child
    assert sleeper.wait(timeout=30) == -signal.SIGUSR1


def test_forked_child_in_a_new_session_leads_its_own_process_group():
    r, w = os.pipe()
    child = Forked(lambda: os.write(w, f"{os.getsid(0)} {os.getpgid(0)}".encode()) and 0, new_session=True)
    assert child.wait(timeout=30) == 0
    os.close(w)
    sid, pgid = map(int, os.read(r, 100).split())
    os.close(r)
    assert sid == pgid == child.pid != os.getsid(0)


def test_children_are_listed_by_the_kernel_and_by_the_scan_alike():
    kids = [Forked(lambda: signal.pause()) for _ in range(2)]
    try:
        listed, scanned = set(children_of(os.getpid())), set(scan_children(os.getpid()))
        assert {k.pid for k in kids} <= listed and listed == scanned
    finally:
        for k in kids:
            k.send_signal(signal.SIGKILL)
            k.wait(timeout=30)
    assert not {k.pid for k in kids} & set(children_of(os.getpid()))   # reaped: no longer listed


def _agent_forking(expected: int, forks: int, gap_s: float, timeout_s: float) -> list[str]:
    """A stand-in for the elastic agent, in its own process (so it has no other children): it forks
    `forks` ranks `gap_s` apart; the first waits for `expected` siblings. The events in the order written."""
    r, w = os.pipe()

    def first_rank():
        ok = await_siblings(expected, timeout_s=timeout_s)
        os.write(w, f"first rank passed {ok}\n".encode())

    def agent():
        ranks = []
        for i in range(forks):
            if i:
                time.sleep(gap_s)
                os.write(w, f"forking rank {i}\n".encode())
            ranks.append(Forked(first_rank if i == 0 else (lambda: signal.pause())))
        ranks[0].wait(timeout=60)
        for k in ranks[1:]:
            k.send_signal(signal.SIGKILL)
            k.wait(timeout=30)

    assert Forked(agent).wait(timeout=120) == 0
    os.close(w)
    with os.fdopen(r) as f:
        return f.read().splitlines()


def test_a_forked_rank_connects_only_once_its_agent_forked_them_all():
    # forked.py's third hazard: a fork while the agent's store thread holds glibc's resolver lock
    assert _agent_forking(expected=3, forks=3, gap_s=0.2, timeout_s=60) == [
        "forking rank 1", "forking rank 2", "first rank passed True"]
    # a sibling that never comes (one that ended before the last fork): bounded, and says so
    assert _agent_forking(expected=3, forks=2, gap_s=0.05, timeout_s=0.3) == [
        "forking rank 1", "first rank passed False"]


class _Failure:
    def __init__(self, timestamp: int, message: str | None):
        self.timestamp = timestamp
        self.error_file_data = {"message": {"message": message, "extraInfo": {}}} if message else {}


def test_the_root_cause_is_not_the_rank_that_lost_its_peer():
    from ddlbench.launch.failures import is_lost_peer, root_cause
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:63671"
    assert is_lost_peer(lost) and not is_lost_peer("RuntimeError: injected fault at step 2") and not is_lost_peer(None)
    # same second (elastic's timestamps are whole seconds): a SIGKILLed rank 1 (no error file)
    # vs rank 0 failing because of it
    assert root_cause({0: _Failure(100, lost), 1: _Failure(100, None)}) == 1
    assert root_cause({0: _Failure(100, lost), 1: _Failure(101, "RuntimeError: injected fault")}) == 1
    # two real errors: the earlier one; only lost peers: the earliest of them
    assert root_cause({0: _Failure(101, "ValueError: a"), 1: _Failure(100, "ValueError: b")}) == 1
    assert root_cause({0: _Failure(101, lost), 1: _Failure(100, lost)}) == 1


def test_a_rank_aborted_by_nccls_watchdog_is_a_timeout(tmp_path):
    """NCCL's watchdog SIGABRTs a rank whose collective timed out; no error file is written, so
    the status comes from the rank's log (not yet seen on a GPU: the line is NCCL's own text)."""
    from ddlbench.launch.local import classify, rank_log_tail
    log = tmp_path / "logs" / "run_abc" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("x" * 70000 + "\n[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                   "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=300000) ran for 300004 "
                   "milliseconds before timing out.\n")
    tail = rank_log_tail(tmp_path, 1)
    assert len(tail) == 65536 and "Watchdog caught" in tail
    aborted = {"rank": 1, "signal": "SIGABRT", "message": "<NONE>", "traceback": None}
    assert classify(aborted, tail) == "timeout"
    assert classify(aborted, "") == "failed"                              # an abort for another reason
    assert classify({**aborted, "signal": "SIGKILL"}, tail) == "failed"   # not the watchdog's signal
    assert classify({"message": "RuntimeError: CUDA out of memory"}) == "oom"
    assert rank_log_tail(tmp_path, 0) == "" and rank_log_tail(tmp_path, None) == ""


def test_a_reserved_port_is_kept_from_others_and_left_to_the_store():
    """reserve_port(): while its socket is open, a plain bind to the port fails (no other process is
    handed it), yet torch's TCPStore listens on it and a client reaches that store."""
    import errno
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    from ddlbench.launch.agent import reserve_port
    port, held = reserve_port()
    with held:
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with other, pytest.raises(OSError) as exc:
            other.bind(("127.0.0.1", port))
        assert exc.value.errno == errno.EADDRINUSE
        server = TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
        client = TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
        server.set("k", "v")
        assert client.get("k") == b"v"
