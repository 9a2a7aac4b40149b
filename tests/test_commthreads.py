"""Communication threads first (ddlbench/comm/threads.py): the policy read from the environment,
which threads it moves, and, in a real gloo process group, that they run SCHED_FIFO and go back."""
import json
import subprocess
import sys

import pytest

from ddlbench.comm import threads as commthreads
from ddlbench.errors import ConfigError


def test_the_policy_comes_from_the_environment():
    assert commthreads.policy({}) == "fair"
    assert commthreads.policy({"DDLBENCH_COMM_THREADS": ""}) == "fair"
    assert commthreads.policy({"DDLBENCH_COMM_THREADS": "fifo"}) == "fifo"
    with pytest.raises(ConfigError, match="one of fair, fifo"):
        commthreads.policy({"DDLBENCH_COMM_THREADS": "realtime"})


def test_only_gloo_threads_are_chosen():
    threads = [(1, "python"), (2, "gloo_tcp_loop"), (3, "pt_gloo_runloop"), (4, "pt_autograd_0"), (5, "bench")]
    assert commthreads.selected(threads) == [(2, "gloo_tcp_loop"), (3, "pt_gloo_runloop")]


def test_fair_moves_nothing_and_point_to_point_keeps_fair():
    assert commthreads.apply({}) == {"policy": "fair", "threads": []}
    out = commthreads.apply({"DDLBENCH_COMM_THREADS": "fifo"}, p2p=True)
    assert out["policy"] == "fair" and out["threads"] == [] and "point to point" in out["note"]


SCRIPT = """
import json, os, sys, tempfile
import torch.distributed as dist
from ddlbench.comm import threads as commthreads
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
dist.barrier()
out = commthreads.apply({"DDLBENCH_COMM_THREADS": "fifo"})
names = dict(commthreads.threads())
fifo = sorted(names[t] for t, _ in commthreads.selected(commthreads.threads()) if os.sched_getscheduler(t) == os.SCHED_FIFO)
commthreads.reset()
after = sorted(names[t] for t, _ in commthreads.selected(commthreads.threads()) if os.sched_getscheduler(t) == os.SCHED_FIFO)
main_fifo = os.sched_getscheduler(0) == os.SCHED_FIFO
print(json.dumps({"apply": out, "fifo": fifo, "after_reset": after, "main_fifo": main_fifo, "root": os.geteuid() == 0}))
dist.destroy_process_group()
"""


def test_in_a_gloo_group_its_threads_run_fifo_and_go_back():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["main_fifo"]                      # compute stays with the fair scheduler
    if out["root"]:
        assert out["apply"]["policy"] == "fifo" and "pt_gloo_runloop" in out["apply"]["threads"]
        assert out["fifo"] == sorted(out["apply"]["threads"])
        assert out["after_reset"] == []
    else:                                            # said, not silently skipped
        assert out["apply"]["policy"] == "fair" and "CAP_SYS_NICE" in out["apply"]["note"]
