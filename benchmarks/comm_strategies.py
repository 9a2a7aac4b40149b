"""Communication-reducing strategies against DDP, measured here, and the projection's error.

    .venv/bin/python benchmarks/comm_strategies.py OUT_DIR [--ranks 4] [--skip-quality] [--skip-validation] [--resume]

1. Time to target (statistical efficiency): experiment=seed_language_tiny (GPT-2 tiny on the
   Markov source, target 1.25 x the entropy-rate floor, 2 epochs) at --ranks ranks emulating
   2 nodes, for DDP, DASO, post-local SGD, PowerSGD and the fp16 hook; then `bench report`.
2. Projection validation: DDP, DASO and post-local SGD in benchmark mode at 1, 2 and 4 ranks
   (1 thread per rank); each multi-rank step time predicted from the 1-rank run and the run's
   own collectives on conf/network/local_gloo.yaml, next to the measured one.
Prints both tables; every number comes from the result files it writes. A result already in
OUT_DIR is an error unless --resume (then it is read back, not re-measured, and counted as reused).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from runs import reuse

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "ddlbench.cli"]

STRATEGIES = {   # label -> overrides (DASO's nodes: 2 ranks each)
    "ddp": ["framework=ddp"],
    "daso": ["framework=daso", "framework.options.ranks_per_node=2"],
    "ddp:local_sgd": ["framework=ddp_local_sgd"],
    "ddp:powersgd": ["framework=ddp_powersgd"],
    "ddp:fp16_hook": ["framework=ddp_fp16_hook"],
}


RESUME = {"on": False, "reused": 0}


def bench_run(run_dir: Path, *overrides: str) -> dict:
    if reuse(run_dir, RESUME["on"]):
        RESUME["reused"] += 1
    else:
        subprocess.run([*BENCH, "run", "logger=none", "run.progress=false", f"run.dir={run_dir}", *overrides],
                       cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
    return json.loads((run_dir / "result.json").read_text())


def quality(out: Path, ranks: int) -> None:
    rows = []
    for label, ov in STRATEGIES.items():
        rec = bench_run(out / "quality" / label.replace(":", "_"), "experiment=seed_language_tiny",
                        f"launcher.nproc={ranks}", *ov)
        conv, comm = rec.get("convergence") or {}, rec.get("comm") or {}
        evals = conv.get("eval") or []
        rows.append([label, rec["status"], conv.get("time_to_target_s"), conv.get("steps_to_target"),
                     evals[-1]["loss"] if evals else None, comm.get("wire_bytes_per_rank"),
                     (rec.get("throughput") or {}).get("samples_per_s")])
    ref = next(r for r in rows if r[0] == "ddp")
    print(f"\nTime to target, seed_language_tiny, {ranks} ranks (target 1.25 x floor):")
    print(f"{'strategy':15} {'status':8} {'ttt s':>8} {'vs ddp':>7} {'steps':>6} {'final loss':>10} "
          f"{'sent/rank/step':>15} {'vs ddp':>7} {'samples/s':>9}")
    for r in rows:
        rel = f"{r[2] / ref[2]:.2f}" if r[2] and ref[2] else "-"
        wrel = f"{r[5] / ref[5]:.2f}" if r[5] and ref[5] else "-"
        print(f"{r[0]:15} {r[1]:8} {r[2] or float('nan'):8.2f} {rel:>7} {str(r[3]):>6} {r[4] or float('nan'):10.4f} "
              f"{(r[5] or 0) / 2**20:12.3f} MiB {wrel:>7} {r[6] or float('nan'):9.1f}")
    subprocess.run([*BENCH, "report", str(out / "quality"), "-o", str(out / "quality_report")], cwd=REPO,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    print(f"report: {out / 'quality_report' / 'report.html'}")


def validation(out: Path) -> None:
    from ddlbench.network.model import load
    from ddlbench.project.validate import predict

    net = load("local_gloo")
    steps = ["debug=fast", "run.warmup_steps=3", "run.measure_steps=12", "launcher.threads_per_rank=1"]
    print("\nProjection validation on this machine (local_gloo), per-device batch held (weak scaling):")
    print(f"{'strategy':15} {'ranks':>5} {'measured ms':>11} {'predicted ms':>12} {'error':>7} "
          f"{'compute ms':>10} {'comm ms':>8} {'oversub':>7}")
    errors = []
    for label in ("ddp", "daso", "ddp:local_sgd"):
        ov = STRATEGIES[label]
        if label == "daso":
            ov = ["framework=daso", "framework.options.ranks_per_node=1"]
        one = bench_run(out / "validation" / f"{label.replace(':', '_')}_1", *ov, "launcher.nproc=1",
                        *steps, "run.global_batch=4")
        for n in (2, 4):
            rec = bench_run(out / "validation" / f"{label.replace(':', '_')}_{n}", *ov, f"launcher.nproc={n}",
                            *steps, f"run.global_batch={4 * n}")
            p = predict(rec, one, net)
            errors.append(abs(p["relative_error"]))
            print(f"{label:15} {n:5d} {p['measured_step_s'] * 1e3:11.2f} {p['predicted_step_s'] * 1e3:12.2f} "
                  f"{p['relative_error']:+7.1%} {p['compute_s'] * 1e3:10.2f} {p['comm_s'] * 1e3:8.2f} "
                  f"{p['oversubscription']:7.1f}")
    print(f"mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-validation", action="store_true")
    ap.add_argument("--resume", action="store_true", help="read back results already in OUT_DIR")
    args = ap.parse_args()
    RESUME["on"] = args.resume
    if not args.skip_quality:
        quality(args.out, args.ranks)
    if not args.skip_validation:
        validation(args.out)
    if RESUME["reused"]:
        print(f"\n{RESUME['reused']} run(s) read back from {args.out} (--resume), not measured now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
