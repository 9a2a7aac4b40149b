"""run.checkpoint's sync against async saves (in a thread, and in DCP's background process), measured in
one run of each per framework: what a save blocks the loop, how long until it is durable, the steps' slowdown while an async save is
written, and the rate a save reached beside a plain write of the same size to the same directory.
The issue's published points of comparison (Llama 3 8B on H100s): NeMo Automodel #635 blocked 27.34 s
sync vs 0.54 s async; torchtitan #1287 0.02 s blocked async with the next steps 6.7-8.3% slower.

    .venv/bin/python benchmarks/checkpoint_modes.py OUT_DIR [--frameworks ddp,fsdp_full] [--model gpt2_tiny]
        [--set model.n_embd=512 model.n_layer=4 model.vocab_size=8192]

The modes' runs of a framework alternate (sync, async, async_process, then again with --repeats 2) so
that load on the machine falls on each. Prints the machine's CPU matmul probe beside the figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

from runs import bench_run

MODES = ("sync", "async", "async_process")
STEPS = ("launcher.nproc=2", "run.warmup_steps=2", "run.measure_steps=8", "run.checkpoint.every=2",
         "run.comm_profile=false", "logger=none", "run.progress=false")


def run(run_dir: Path, resume: bool, *overrides: str) -> dict:
    return bench_run(run_dir, resume, (*STEPS, *overrides), 1800)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--frameworks", default="ddp,fsdp_full")
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--set", nargs="*", default=["model.n_embd=512", "model.n_layer=4", "model.vocab_size=8192"],
                    help="more overrides of every run (default: gpt2_tiny widened to ~17M parameters)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    import torch

    from ddlbench.machine.hardware import probe_cpu_matmul
    gflops = probe_cpu_matmul(torch.get_num_threads(), torch.float32, seconds=1.0) / 1e9
    print(f"machine: CPU matmul probe {gflops:.0f} GFLOP/s ({torch.get_num_threads()} threads); model {a.model} "
          f"{' '.join(a.set)}; {' '.join(STEPS)}")
    failed = 0
    for fw in a.frameworks.split(","):
        got: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for r in range(a.repeats):
            for mode in MODES:
                rec = run(a.out / f"{fw}-{mode}-{r}", a.resume, f"framework={fw}", f"model={a.model}",
                          f"run.checkpoint.mode={mode}", *a.set)
                if rec.get("status") != "ok":
                    print(f"{fw} {mode}: {rec.get('status')} {(rec.get('error') or {}).get('message', '')[:200]}")
                    failed += 1
                    continue
                got[mode].append(rec["checkpoint"])
        if not got["sync"]:
            continue
        sync_b = median(c["blocked_s_median"] for c in got["sync"])
        ck = got["sync"][-1]
        print(f"{fw}: {ck['bytes_per_save'] / 2**20:.0f} MiB a save; sync: blocked {sync_b:.3f} s, rate "
              f"{(ck['bytes_per_s'] or 0) / 2**20:.0f} MiB/s vs plain write {(ck['plain_write_bytes_per_s'] or 0) / 2**20:.0f} MiB/s")
        for mode in MODES[1:]:
            if not got[mode]:
                continue
            blocked = median(c["blocked_s_median"] for c in got[mode])
            first = median(c["saves"][0]["blocked_s"] for c in got[mode])
            slow = [c["slowdown_median"] for c in got[mode] if c["slowdown_median"] is not None]
            print(f"  {mode}: blocked {blocked:.3f} s ({blocked / sync_b:.2f}x sync; the first save {first:.3f} s), "
                  f"durable {median(c['durable_s_median'] for c in got[mode]):.3f} s; steps while it is written "
                  f"{'+%.1f%%' % (100 * median(slow)) if slow else 'none ended'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
