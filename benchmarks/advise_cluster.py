"""`bench advise evaluate=all` on the emulated 2-node cluster with a slow inter-node link: the
advice priced on the network `bench commbench` fitted there, every candidate measured across the
two nodes, the recommendation judged by its regret (docs/advise-evaluation.md).

    .venv/bin/python benchmarks/advise_cluster.py OUT_DIR [--link 100mbit] [--model gpt2_tiny]
        [--frameworks ddp,fsdp_full,...] [--budget 3] [--micro-batches 2,8]

Root only (network namespaces; docs/cluster.md). `bench cluster up nodes=2 link=LINK`; `bench
commbench launcher=slurm` across the nodes (OUT_DIR/commbench/network.yaml: the link fitted per
collective kind and message size); `bench advise ... backend=slurm network=<that yaml>`: the
1-rank calibrations run on one node, every candidate as a Slurm job over both nodes (one rank per
node: launcher=slurm launcher.nodes=2); `bench advise resume` after each job array has drained,
until the advice is done; `bench cluster down`. Prints the advice; its state is
OUT_DIR/advise/advice.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = str(Path(sys.executable).parent / "bench")
NAME = "advise"
FRAMEWORKS = "ddp,fsdp_full,fsdp_grad_op,deepspeed_zero2,fairscale_oss,pipeline_1f1b,horovod"
RUN = ["run.warmup_steps=2", "run.measure_steps=8", "run.progress=false", "logger=none"]


def cluster(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, "cluster", *args], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


def login(*cmd: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    proc = cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-3000:])
    return proc


def drained(poll_s: float = 5.0, limit_s: float = 3600) -> None:
    """Wait until the cluster's queue is empty (the advice's job array has finished)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        q = cluster("exec", f"name={NAME}", "--", "squeue", "-h", "-o", "%i")
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(poll_s)
    raise SystemExit(f"the cluster's queue did not drain within {limit_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--link", default="100mbit")
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--frameworks", default=FRAMEWORKS)
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--micro-batches", default="2,8")
    args = ap.parse_args()
    out = args.out.resolve()
    if (out / "advise" / "advice.json").exists():
        raise SystemExit(f"{out}/advise already holds an advice; choose an empty OUT_DIR")
    cluster("down", f"name={NAME}")
    up = cluster("up", "nodes=2", f"link={args.link}", f"name={NAME}")
    if up.returncode != 0:
        raise SystemExit(f"bench cluster up failed: {up.stderr[-2000:]}")
    t0 = time.monotonic()
    try:
        cb = login("srun", "-N2", "--ntasks-per-node=1", BENCH, "commbench", "launcher=slurm",
                   "sizes=[262144,1048576,4194304]", "iters=20", "warmup=2", f"out={out / 'commbench'}")
        network = out / "commbench" / "network.yaml"
        if cb.returncode != 0 or not network.exists():
            raise SystemExit("commbench did not write a fitted network")
        proc = login(BENCH, "advise", f"model={args.model}", "devices=2", "global_batch=16",
                     f"micro_batches=[{args.micro_batches}]", f"frameworks={args.frameworks}",
                     f"budget_runs={args.budget}", "repeats=2", "evaluate=all", "backend=slurm",
                     f"network={network}", f"dir={out / 'advise'}", *RUN)
        state = out / "advise" / "advice.json"
        while proc.returncode == 0 and json.loads(state.read_text())["phase"] != "done":
            drained()
            proc = login(BENCH, "advise", "resume", str(out / "advise"))
        if proc.returncode != 0:
            raise SystemExit(f"bench advise exited {proc.returncode}")
    finally:
        cluster("down", f"name={NAME}")
    print(f"advise on 2 nodes x 1 core at {args.link}: {time.monotonic() - t0:.0f} s; state: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
