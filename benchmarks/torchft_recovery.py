"""Recovery without a restart, measured with torchft (fault-tolerant DDP across replica groups, its
lighthouse from its own wheel, gloo on CPU): two replica groups train a ddlbench model; group 1 is
SIGKILLed before step `--kill-at` and started again at once, as a scheduler would; group 0 trains on
alone meanwhile, and the new group 1 heals from it (torchft's live recovery: the state sent over HTTP)
and rejoins. Against issue 67's elastic restart (benchmarks/recovery.py), where every rank stops.

    .venv/bin/python benchmarks/torchft_recovery.py OUT_DIR [--model gpt2_tiny] [--steps 120] [--kill-at 20]
        [--batch 8]

Prints, from each group's per-step log (OUT_DIR/steps.jsonl): the survivor's steps lost (its committed
steps never go back), its stall when the failure struck (the longest step then, beside its median
healthy step), the job's samples/s healthy (two groups) and degraded (one), and the replacement's time
from process start to its first step with both groups, the step it healed to, and that heal's seconds.
Each group is one process with 1 thread; the machine's CPU matmul probe is printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from statistics import median

REJOINED = 5


def replica(group: int, lighthouse: str, steps: int, kill_at: int | None, log: Path, model: str, batch: int,
            wait_s: float) -> None:
    """One replica group (one rank): torchft's Manager over a gloo group of its own, its DDP wrapper,
    the optimizer stepped only when the quorum commits; one JSON line per step."""
    started = time.time()
    import torch
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    from ddlbench import models
    from ddlbench.models.spec import example_batch
    from ddlbench.planning.config import plan_from_overrides
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = models.build(plan_from_overrides([f"model={model}"]).cfg.model, "cpu")
    net = spec.build()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    healed = {}

    def load(state):
        t0 = time.time()
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        healed["apply_s"] = time.time() - t0

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), load_state_dict=load,
                      state_dict=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
                      min_replica_size=1, rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
                      lighthouse_addr=lighthouse, replica_id=f"group{group}", timeout=timedelta(seconds=10),
                      quorum_timeout=timedelta(seconds=30))
    ddp = DistributedDataParallel(manager, net)
    data = example_batch(spec, batch, "cpu")
    parent, deadline = os.getppid(), time.time() + wait_s
    (log.parent / f"ready{group}").touch()      # the first two groups start training together
    while group != 1 or kill_at is not None:
        if (log.parent / f"ready{1 - group}").exists():
            break
        time.sleep(0.01)
    # 0: not both groups yet, 1: both, 2: the other group lost (the replacement starts here); each group
    # trains `steps` steps and then on until REJOINED steps with both groups after the loss
    phase, together = (2 if group == 1 and kill_at is None else 0), 0
    with open(log, "a") as out:
        while manager.current_step() < steps or together < REJOINED:
            if os.getppid() != parent or time.time() > deadline:    # the benchmark gone, or no rejoin in time
                raise SystemExit(f"group {group}: stopped at step {manager.current_step()} ({together} steps rejoined)")
            if kill_at is not None and manager.current_step() >= kill_at:
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            before = manager.current_step()
            t0 = time.time()
            manager.start_quorum()
            opt.zero_grad()
            loss = ddp(**data)
            loss.backward()
            committed = manager.should_commit()
            if committed:
                opt.step()
            n = manager.num_participants()
            phase = {(0, 2): 1, (1, 1): 2}.get((phase, n), phase)
            together += phase == 2 and n == 2
            out.write(json.dumps({"group": group, "pid": os.getpid(), "started": started, "before": before,
                                  "step": manager.current_step(), "t0": t0, "t": time.time(), "committed": committed,
                                  "participants": manager.num_participants(), "loss": float(loss.detach()),
                                  "healed": healed.pop("apply_s", None)}) + "\n")
            out.flush()


def summarize(rows: list[dict], kill_at: int, batch: int) -> dict:
    """The figures above from the groups' step logs (rows in the order written)."""
    first_pid = next(r["pid"] for r in rows if r["group"] == 1)
    survivor = [r for r in rows if r["group"] == 0]
    replacement = [r for r in rows if r["group"] == 1 and r["pid"] != first_pid]
    killed = max(r["t"] for r in rows if r["group"] == 1 and r["pid"] == first_pid)
    steps = [r["step"] for r in survivor if r["committed"]]
    dt = [(r["t"] - r["t0"], r["participants"]) for r in survivor]
    healthy = [d for d, n in dt if n == 2]
    degraded = [d for d, n in dt if n == 1]
    # the survivor's first step after the kill: the failure seen (a collective that ended in error), the quorum redone
    stall = max(r["t"] - r["t0"] for r in survivor if r["t"] > killed and r["participants"] == 1) if degraded else None
    joined = next((r for r in replacement if r["participants"] == 2 and r["committed"]), None)
    return {
        "steps_lost": max(0, max(a - b for a, b in zip(steps, steps[1:]))) if len(steps) > 1 else None,
        "survivor_steps_alone": sum(1 for r in survivor if r["participants"] == 1 and r["t"] > killed),
        "stall_s": stall, "healthy_step_s": median(healthy) if healthy else None,
        "degraded_step_s": median(degraded) if degraded else None,
        "job_samples_per_s_healthy": 2 * batch / median(healthy) if healthy else None,
        "job_samples_per_s_degraded": batch / median(degraded) if degraded else None,
        "replacement_start_to_joined_s": joined["t"] - joined["started"] if joined else None,
        "killed_to_joined_s": joined["t"] - killed if joined else None,
        # the replacement's first step ran at the job's step (healed: the survivor's state of the step before)
        "healed_to_step": next((r["step"] - 1 for r in replacement if r["healed"] is not None), None),
        "heal_apply_s": next((r["healed"] for r in replacement if r["healed"] is not None), None),
        "heal_step_s": next((r["t"] - r["t0"] for r in replacement if r["healed"] is not None), None),
        "kill_at": kill_at,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--wait-s", type=float, default=300, help="a group gives up after this long (no rejoin)")
    ap.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", help=argparse.SUPPRESS)
    ap.add_argument("--kill", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    log = a.out / "steps.jsonl"
    if a.replica is not None:
        replica(a.replica, a.lighthouse, a.steps, a.kill_at if a.kill else None, log, a.model, a.batch, a.wait_s)
        return 0
    os.environ.setdefault("RUST_LOG", "warn")     # the lighthouse (in this process) logs every quorum at info
    import torch
    from torchft._torchft import LighthouseServer

    from ddlbench.machine.hardware import probe_cpu_matmul
    gflops = probe_cpu_matmul(torch.get_num_threads(), torch.float32, seconds=1.0) / 1e9
    print(f"machine: CPU matmul probe {gflops:.0f} GFLOP/s ({torch.get_num_threads()} threads); torchft "
          f"{__import__('importlib.metadata').metadata.version('torchft')}; model {a.model}, batch {a.batch} per group, "
          f"{a.steps} steps, group 1 killed before step {a.kill_at}")
    a.out.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    for ready in a.out.glob("ready*"):
        ready.unlink()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=1000)
    cmd = [sys.executable, __file__, str(a.out), "--model", a.model, "--steps", str(a.steps), "--kill-at",
           str(a.kill_at), "--batch", str(a.batch), "--wait-s", str(a.wait_s), "--lighthouse", lighthouse.address()]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": open(a.out / "replicas.log", "w")}
    procs = []
    try:
        procs += [subprocess.Popen([*cmd, "--replica", "0"], **quiet),
                  subprocess.Popen([*cmd, "--replica", "1", "--kill"], **quiet)]
        procs[1].wait(timeout=600)
        procs.append(subprocess.Popen([*cmd, "--replica", "1"], **quiet))
        codes = procs[0].wait(timeout=600), procs[2].wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()
    victim = procs[1]
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    if victim.returncode != -signal.SIGKILL or codes != (0, 0):
        print(f"the replica groups ended {victim.returncode}, {codes}: see {a.out / 'replicas.log'}")
        return 1
    got = summarize(rows, a.kill_at, a.batch)
    (a.out / "summary.json").write_text(json.dumps(got, indent=1))
    fmt = {k: (f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in got.items()}
    print(f"survivor: {fmt['steps_lost']} steps lost, {fmt['survivor_steps_alone']} steps alone; stall when the "
          f"failure struck {fmt['stall_s']} s (median healthy step {fmt['healthy_step_s']} s, alone "
          f"{fmt['degraded_step_s']} s)")
    print(f"job: {fmt['job_samples_per_s_healthy']} samples/s with both groups, {fmt['job_samples_per_s_degraded']} "
          f"degraded")
    print(f"replacement: process start -> first step with both groups {fmt['replacement_start_to_joined_s']} s "
          f"(kill -> rejoined {fmt['killed_to_joined_s']} s); healed to step {fmt['healed_to_step']} "
          f"(that step {fmt['heal_step_s']} s: quorum, the state fetched over HTTP and applied in {fmt['heal_apply_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
