"""Loading a checkpoint on another layout (issue 67 item 3), on CPU: each source run saves at step 3
and trains to step 5 (run.checkpoint.every=2, keep=2); each target resumes from the source's step_3
(run.checkpoint.resume_from) on its own framework and world size and trains 2 steps. Per pair:
whether it loaded, the reason where not, and continuity: the largest relative difference between
the target's 2 losses and the source's steps 3 and 4 (0 where the arithmetic is the same). A target
marked `universal` loads DeepSpeed's universal checkpoint made from the source's save
(`python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state`, timed), as DeepSpeed's docs
reshard a ZeRO checkpoint to another data-parallel size.

    .venv/bin/python benchmarks/reshard_matrix.py OUT_DIR [--model gpt2_tiny] [--sources deepspeed_zero3] [--resume]

Prints a Markdown table (docs/checkpoints.md holds the committed one, with this command).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from runs import bench_run

COMMON = ("debug=fast", "run.comm_profile=false")
# source: (framework, ranks); targets: (framework, ranks)
PAIRS = [
    (("fsdp_full", 2), [("fsdp_full", 2), ("fsdp_full", 1), ("ddp", 1), ("ddp", 2), ("tensor_parallel", 2),
                         ("pipeline_1f1b", 2)]),
    (("fsdp_full", 1), [("fsdp_full", 2)]),
    (("tensor_parallel_fsdp", 4), [("fsdp_full", 2), ("tensor_parallel", 2)]),
    (("ddp", 2), [("fsdp_full", 2), ("deepspeed_zero2", 2)]),
    (("deepspeed_zero3", 2), [("deepspeed_zero3", 2), ("deepspeed_zero3", 1), ("deepspeed_zero2", 2),
                               ("deepspeed_zero3", 1, "universal"), ("deepspeed_zero2", 1, "universal"),
                               ("deepspeed_zero3", 2, "universal")]),
    (("deepspeed_zero2", 2), [("deepspeed_zero2", 1), ("deepspeed_zero2", 1, "universal"),
                               ("deepspeed_zero3", 2, "universal")]),
    (("pipeline_1f1b", 2), [("pipeline_1f1b", 2), ("ddp", 2)]),
    (("horovod", 2), [("horovod", 2)]),
    (("fairscale_oss", 2), [("fairscale_oss", 2)]),
]


def run(run_dir: Path, resume: bool, *overrides: str) -> dict:
    return bench_run(run_dir, resume, (*COMMON, *overrides), 900, {"status": "no result", "error": {"message": "-"}})


def universal(saved: Path, out: Path) -> tuple[Path | None, str]:
    """DeepSpeed's universal checkpoint of `saved` under `out` (made once): its path and how long the
    conversion took, or None and why it failed."""
    target = out / saved.name
    if not (target / "zero").is_dir():
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(saved),
                               "--output_folder", str(target), "--inject_missing_state"],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return None, (proc.stderr.strip().splitlines() or ["no output"])[-1]
        (out / "seconds").write_text(f"{time.perf_counter() - t0:.2f}")
    return target, f"converted in {(out / 'seconds').read_text()} s"


def losses(rec: dict) -> list[float]:
    return [loss for _, loss in (rec.get("convergence") or {}).get("train_loss") or []]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="gpt2_tiny")
    ap.add_argument("--sources", help="only the pairs saved by these frameworks (comma-separated)")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    print(f"model {a.model}; source: {' '.join(COMMON)} run.measure_steps=4 run.checkpoint.every=2 "
          "run.checkpoint.keep=2; target: run.measure_steps=1 run.checkpoint.resume_from=<source>/checkpoints/step_3\n")
    print("| saved by | loaded by | outcome | continuity (max rel. loss difference, 2 steps) |")
    print("|---|---|---|---|")
    for (sfw, sn), targets in PAIRS:
        if a.sources and sfw not in a.sources.split(","):
            continue
        src = run(a.out / f"{sfw}-n{sn}", a.resume, f"framework={sfw}", f"launcher.nproc={sn}", f"model={a.model}",
                  "run.measure_steps=4", "run.checkpoint.every=2", "run.checkpoint.keep=2")
        if src.get("status") != "ok":
            print(f"| {sfw} x{sn} | - | source {src.get('status')}: {(src.get('error') or {}).get('message', '')[:150]} | - |")
            continue
        saved = Path(src["checkpoint"]["dir"]) / "step_3"
        for tfw, tn, *how in targets:
            path, note = saved, ""
            if how:
                path, note = universal(saved, a.out / f"{sfw}-n{sn}-universal")
                if path is None:
                    print(f"| {sfw} x{sn} | {tfw} x{tn} (universal) | conversion failed: {note[:200]} | - |")
                    continue
                note = f"; universal, {note}"
            rec = run(a.out / f"{sfw}-n{sn}--{tfw}-n{tn}{'-' + how[0] if how else ''}", a.resume, f"framework={tfw}",
                      f"launcher.nproc={tn}", f"model={a.model}", "run.measure_steps=1",
                      f"run.checkpoint.resume_from={path}")
            if rec.get("status") == "ok":
                got, want = losses(rec), losses(src)[3:5]
                diff = max(abs(x - y) / abs(y) for x, y in zip(got, want)) if len(got) == len(want) else float("inf")
                r = rec["checkpoint"]["restore"]
                outcome = f"loaded (read {r['read_s']:.2f} s{note})"
                cont = "exact" if diff == 0 else f"{diff:.1e}"
            else:
                msg = (rec.get("error") or {}).get("message", "") or ""
                outcome = f"{rec.get('status')}: {msg.replace('|', '/')[:220]}"
                cont = "-"
            print(f"| {sfw} x{sn} | {tfw} x{tn}{' (' + how[0] + ')' if how else ''} | {outcome} | {cont} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
