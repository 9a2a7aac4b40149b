"""run.compile against eager for every pair the compile issue names, at 2 ranks on CPU: ddp,
fsdp_full, deepspeed_zero2 and horovod on gpt2_tiny and llama_tiny (8 pairs). The suite
(tests/test_compile.py) runs 4 of them, the models alternating, because compiling on CPU is slow;
this runs all 8 and prints per pair: both statuses, the largest relative loss difference (the
suite's bound: 1e-4), the compile time and the compiled/eager throughput ratio measured in one run.

    .venv/bin/python benchmarks/compile_pairs.py OUT_DIR [--resume] [--pairs ddp:llama_tiny,...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runs import bench_run, verdict

FRAMEWORKS = ("ddp", "fsdp_full", "deepspeed_zero2", "horovod")
MODELS = ("gpt2_tiny", "llama_tiny")
# as tests/test_compile.py
STEPS = ("launcher.nproc=2", "run.warmup_steps=1", "run.measure_steps=3", "run.global_batch=8",
         "run.comm_profile=false", "logger=none", "run.progress=false")
LOSS_RTOL = 1e-4


def run(run_dir: Path, resume: bool, *overrides: str) -> dict:
    return bench_run(run_dir, resume, (*STEPS, *overrides), 900, {"status": "no result", "error": None})


def max_rel_diff(a: list[float], b: list[float]) -> float:
    """The largest |a - b| / |a| over paired losses (inf when the series differ in length)."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def losses(rec: dict) -> list[float]:
    return [loss for _, loss in (rec.get("convergence") or {}).get("train_loss") or []]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--pairs", help="framework:model,... (default: all 8)")
    a = ap.parse_args()
    pairs = ([tuple(p.split(":")) for p in a.pairs.split(",")] if a.pairs
             else [(f, m) for f in FRAMEWORKS for m in MODELS])
    rows, statuses = [], []
    print(f"{'framework':16} {'model':11} {'eager':7} {'compiled':9} {'max rel loss diff':>18} "
          f"{'compile_s':>9} {'compiled/eager':>14}")
    for fw, model in pairs:
        eager = run(a.out / f"{fw}-{model}-eager", a.resume, f"framework={fw}", f"model={model}")
        comp = run(a.out / f"{fw}-{model}-compiled", a.resume, f"framework={fw}", f"model={model}", "run.compile=true")
        diff = max_rel_diff(losses(eager), losses(comp))
        ok = eager["status"] == "ok" and comp["status"] == "ok"
        ratio = (comp["throughput"]["samples_per_s"] / eager["throughput"]["samples_per_s"]) if ok else None
        compile_s = (comp.get("startup_s") or {}).get("compile_s")
        rows.append({"framework": fw, "model": model, "eager": eager["status"], "compiled": comp["status"],
                     "max_rel_loss_diff": diff, "compile_s": compile_s, "compiled_over_eager": ratio,
                     "error": (comp.get("error") or eager.get("error"))})
        statuses += [(eager["status"], "ok"), (comp["status"], "ok"), (diff <= LOSS_RTOL, True)]
        print(f"{fw:16} {model:11} {eager['status']:7} {comp['status']:9} {diff:18.2e} "
              f"{compile_s if compile_s is None else f'{compile_s:.1f}':>9} "
              f"{'-' if ratio is None else f'{ratio:.3f}':>14}", flush=True)
    (a.out / "compile_pairs.json").write_text(json.dumps(rows, indent=1, default=str))
    return verdict(statuses)


if __name__ == "__main__":
    sys.exit(main())
