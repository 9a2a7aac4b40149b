"""Recovery from a killed rank per framework, measured: each run saves every 2 steps, rank 1 is SIGKILLed
before step `--kill-at`, torch's elastic agent restarts every rank (launcher.max_restarts=1) and they
resume from the newest complete save. Prints the record's `recovery` by phase: detection, relaunch,
process group, model build, restore, the steps trained again, and the wall clock lost in all, beside
the run's median step (what the same failure costs where a restart is priced by steps alone).

    .venv/bin/python benchmarks/recovery.py OUT_DIR [--frameworks ddp,fsdp_full,deepspeed_zero2,pipeline_1f1b]
        [--model gpt2_tiny] [--set ...] [--kill-at 7] [--resume]

Prints the machine's CPU matmul probe beside the figures (compare times only within one run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runs import bench_run

STEPS = ("launcher.nproc=2", "launcher.max_restarts=1", "run.warmup_steps=2", "run.measure_steps=8",
         "run.checkpoint.every=2", "fault.kind=kill", "fault.rank=1", "run.comm_profile=false", "logger=none",
         "run.progress=false")
PHASES = ("detect_s", "relaunch_s", "process_group_s", "model_build_s", "restore_s", "redo_s")


def run(run_dir: Path, resume: bool, *overrides: str) -> dict:
    return bench_run(run_dir, resume, (*STEPS, *overrides), 1800)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--frameworks", default="ddp,fsdp_full,deepspeed_zero2,pipeline_1f1b")
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--set", nargs="*", default=[], help="more overrides of every run")
    ap.add_argument("--kill-at", type=int, default=7, help="the step rank 1 is killed before (saves after 4, 6, ...)")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    import torch

    from ddlbench.machine.hardware import probe_cpu_matmul
    gflops = probe_cpu_matmul(torch.get_num_threads(), torch.float32, seconds=1.0) / 1e9
    print(f"machine: CPU matmul probe {gflops:.0f} GFLOP/s ({torch.get_num_threads()} threads); model {a.model} "
          f"{' '.join(a.set)}; {' '.join(STEPS)} fault.step={a.kill_at}")
    print("framework        steps lost  " + "  ".join(f"{p[:-2]:>13}" for p in PHASES) + "   lost (s)  median step (s)")
    failed = 0
    for fw in a.frameworks.split(","):
        rec = run(a.out / fw, a.resume, f"framework={fw}", f"model={a.model}", f"fault.step={a.kill_at}", *a.set)
        r = rec.get("recovery")
        if rec.get("status") != "ok" or not r:
            print(f"{fw}: {rec.get('status')} {(rec.get('error') or {}).get('message', '')[:300]}")
            failed += 1
            continue
        cells = "  ".join(f"{r[p]:>13.3f}" if r[p] is not None else f"{'-':>13}" for p in PHASES)
        print(f"{fw:<16} {r['steps_lost']:>10}  {cells}   {r['lost_s']:>8.3f}  "
              f"{rec['timing']['step_time_s']['median']:>15.4f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
