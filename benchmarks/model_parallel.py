"""Model parallelism on this machine: gpt2_tiny at 2 and 4 ranks under DDP (reference),
pipeline schedules, tensor parallel and the 2-D combinations, all in one run so the numbers
compare. Prints samples/s, the pipeline bubble (analytic vs measured idle) and peak RSS per
rank (= per pipeline stage), and writes the result directories under OUT.

    .venv/bin/python benchmarks/model_parallel.py [OUT] [--resume]   # ~15 min on 2 cores

A result already in OUT is an error unless --resume (then it is read back and marked "reused").
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runs import reuse

REPO = Path(__file__).resolve().parents[1]
COMMON = ["model=gpt2_tiny", "logger=none", "run.progress=false", "run.warmup_steps=3", "run.measure_steps=12",
          "run.global_batch=16"]
CASES = [
    ("ddp", 2, []), ("pipeline_gpipe", 2, ["framework.options.n_microbatches=4"]),
    ("pipeline_1f1b", 2, ["framework.options.n_microbatches=4"]),
    ("pipeline_interleaved", 2, ["framework.options.n_microbatches=4"]),
    ("pipeline_zero_bubble", 2, ["framework.options.n_microbatches=4"]),
    ("tensor_parallel", 2, []),
    ("ddp", 4, []), ("pipeline_1f1b", 4, ["framework.options.n_microbatches=8"]),
    ("pipeline_gpipe", 4, ["framework.options.dp=2", "framework.options.n_microbatches=4"]),
    ("tensor_parallel_fsdp", 4, []), ("pipeline_1f1b", 4, ["framework.options.tp=2", "framework.options.n_microbatches=4"]),
]


def main(out: Path, resume: bool = False) -> None:
    rows = []
    for i, (fw, n, extra) in enumerate(CASES):
        run_dir = out / f"{i:02d}_{fw}_{n}"
        reused = reuse(run_dir, resume)
        if not reused:
            subprocess.run([str(Path(sys.executable).with_name("bench")), "run", f"framework={fw}", f"launcher.nproc={n}",
                            *COMMON, *extra, f"run.dir={run_dir}"], cwd=REPO, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=900)
        rec = json.loads((run_dir / "result.json").read_text())
        mp = rec.get("model_parallel") or {}
        par = rec.get("parallel") or {}
        rss = [m["peak_rss_bytes"] / 2**20 for m in rec["memory"]["per_rank"]] if rec["status"] == "ok" else []
        rows.append({
            "case": f"{fw} {' '.join(e.split('.')[-1] for e in extra)}".strip() + (" (reused)" if reused else ""),
            "ranks": n,
            "dims": f"dp{par.get('dp')} tp{par.get('tp')} pp{par.get('pp')}", "status": rec["status"],
            "samples_s": rec["throughput"]["samples_per_s"] if rec["status"] == "ok" else None,
            "bubble_analytic": mp.get("bubble_fraction_analytic"), "idle_measured": mp.get("idle_fraction_measured_mean"),
            "rss_mib": rss, "stage_params": [r["params"] for r in mp.get("per_rank", [])],
        })
    fmt = "{:<48} {:>5} {:<14} {:>9} {:>8} {:>8}  {}"
    print(fmt.format("case", "ranks", "dims", "samples/s", "bubble", "idle", "peak RSS per rank MiB (stage params)"))
    for r in rows:
        print(fmt.format(r["case"][:48], r["ranks"], r["dims"], f"{r['samples_s']:.1f}" if r["samples_s"] else r["status"],
                         f"{r['bubble_analytic']:.3f}" if r["bubble_analytic"] is not None else "-",
                         f"{r['idle_measured']:.3f}" if r["idle_measured"] is not None else "-",
                         " ".join(f"{x:.0f}" for x in r["rss_mib"]) + (f"  ({', '.join(map(str, r['stage_params']))})"
                                                                       if r["stage_params"] else "")))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--resume"]
    main(Path(args[0]) if args else REPO / "outputs" / "bench_model_parallel", resume="--resume" in sys.argv[1:])
