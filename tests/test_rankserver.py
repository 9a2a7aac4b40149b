"""ddlbench/launch/rankserver.py and hvd_shim.py: Horovod's commands as clients of a server that forks
their ranks. A stand-in for horovodrun (a script that starts the clients the way horovodrun does, each
in its own session) and a stand-in rank; the real Horovod runs are in tests/test_frameworks.py."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from conftest import children, kill_and_reap, leftovers, subreaper, wait_for

from ddlbench.launch import rankserver
from ddlbench.launch.forked import Forked

# horovodrun's part: start each slot's command in a session of its own with the slot's environment,
# wait for them all; here also SIGKILL slot 0's command once its rank runs (horovodrun ending a command)
FAKE_HOROVODRUN = """
import os, subprocess, sys, time
name, tmp = sys.argv[1], sys.argv[2]
shims = [subprocess.Popen([sys.executable, "-m", "ddlbench.launch.hvd_shim", name, tmp, str(slot)],
                          env={**os.environ, "SLOT": str(slot)}, start_new_session=True) for slot in (0, 1)]
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(tmp, "rank0.pid")) and time.monotonic() < deadline:
    time.sleep(0.05)
shims[0].kill()
print("slot 1 exit", shims[1].wait(), flush=True)
sys.exit(shims[1].returncode)
"""


def _stand_in_rank(argv: list[str]) -> int:
    """Slot 0 waits to be killed; slot 1 prints what it was given and exits 3 once slot 0's rank is gone."""
    tmp, slot = Path(argv[0]), argv[1]
    (tmp / f"rank{slot}.pid").write_text(str(os.getpid()))
    if slot == "0":
        time.sleep(120)
        return 0
    pid = int((tmp / "rank0.pid").read_text()) if (tmp / "rank0.pid").exists() else None
    deadline = time.monotonic() + 120
    while pid is None or Path(f"/proc/{pid}").exists() and not _zombie(pid):
        if time.monotonic() > deadline:
            return 9
        time.sleep(0.05)
        if pid is None and (tmp / "rank0.pid").exists():
            pid = int((tmp / "rank0.pid").read_text())
    os.write(1, f"rank {slot}: SLOT={os.environ['SLOT']} cwd={os.getcwd()} pgid={os.getpgid(0)}\n".encode())
    return 3


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_server_forks_each_clients_rank_passes_its_exit_and_kills_a_rank_whose_client_died(tmp_path):
    script = tmp_path / "horovodrun.py"
    script.write_text(FAKE_HOROVODRUN)
    out = tmp_path / "out.txt"
    name = rankserver.address()
    before = set(children())     # what this worker already had (a resource tracker, say) is not the test's
    subreaper(True)
    try:
        with open(out, "w") as f:
            leader = Forked(lambda: rankserver.serve_horovodrun([sys.executable, str(script), name, str(tmp_path)],
                                                                 dict(os.environ), name, worker=_stand_in_rank),
                            new_session=True, stdout=f.fileno(), stderr=f.fileno())
        wait_for(lambda: leader.poll() is not None, 120, "the stand-in horovodrun to end")
        text = out.read_text()
        # horovodrun's exit code is the last client's, which is its rank's (3)
        assert leader.returncode == 3, text
        assert "slot 1 exit 3" in text
        # the rank ran with its client's environment, in its client's directory, in the leader's group
        assert f"rank 1: SLOT=1 cwd={os.getcwd()} pgid={leader.pid}" in text, text
        rank0 = int((tmp_path / "rank0.pid").read_text())
        assert _zombie(rank0), "slot 0's rank outlived its client"
    finally:
        left = leftovers(before, grace_s=5)
        kill_and_reap(left)
        subreaper(False)
    assert not left, left


def test_a_signal_to_the_client_reaches_its_rank_and_the_client_exits_as_the_rank_did(tmp_path):
    """horovodrun ends a command with SIGTERM: the client passes it on; the rank's death by it is the
    client's (what horovodrun reports)."""
    name = rankserver.address()

    def rank(argv):
        Path(argv[0], "up").write_text(str(os.getpid()))
        time.sleep(120)
        return 0
    script = tmp_path / "hvd.py"
    script.write_text("import subprocess, sys\n"
                      "p = subprocess.Popen([sys.executable, '-m', 'ddlbench.launch.hvd_shim', sys.argv[1], sys.argv[2]])\n"
                      "print('client', p.pid, flush=True)\n"
                      "sys.exit(128 - p.wait())\n")
    before = set(children())
    subreaper(True)
    try:
        with open(tmp_path / "out.txt", "w") as f:
            leader = Forked(lambda: rankserver.serve_horovodrun([sys.executable, str(script), name, str(tmp_path)],
                                                                 dict(os.environ), name, worker=rank),
                            new_session=True, stdout=f.fileno(), stderr=f.fileno())
        wait_for(lambda: (tmp_path / "up").exists(), 120, "the rank to start")
        client = int((tmp_path / "out.txt").read_text().split("client")[1].split()[0])
        os.kill(client, signal.SIGTERM)
        wait_for(lambda: leader.poll() is not None, 60, "the stand-in horovodrun to end")
        # the client died of SIGTERM as its rank did: the script exits 128 - (-15)
        assert leader.returncode == 128 + signal.SIGTERM, (tmp_path / "out.txt").read_text()
    finally:
        left = leftovers(before, grace_s=5)
        kill_and_reap(left)
        subreaper(False)
    assert not left, left
