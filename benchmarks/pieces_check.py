"""`bench project ... calibrate=pieces` held against a run on the same host, one rank: the compute it
prices (the model's pieces timed, the run's optimizer timed, the framework's own step over a fake
process group as a factor) against the step the runner measures with the same model, micro-batch
and precision. Each framework's prediction and run in one invocation, alternating, so both see the
same machine. With --ranks N the prediction is for N ranks (the factor then measured over a fake
group of N, the collectives priced on local_gloo, this host's loopback) and the run has N ranks on
this host, `--batch` samples each.

    .venv/bin/python benchmarks/pieces_check.py OUT_DIR [--frameworks ddp,fsdp_full,deepspeed_zero2]
        [--model llama_tiny] [--layers 8] [--batch 4] [--steps 20] [--fake-worlds 1,2,8,64] [--ranks 1]

Prints, per framework: the predicted step (and its parts: pieces x factor, optimizer), the factor, the
measured median and window steps, and the error against the median; with --fake-worlds, rank 0's step
over the fake group at each world size (how the factor moves with the world). Writes
OUT_DIR/pieces_check.json.
Nothing here is asserted: it is a measurement (docs/projection.md keeps the table with this command).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
BENCH = str(Path(sys.executable).parent / "bench")


def cpu() -> list[str]:
    """Where this host has no GPU: run.device=cpu (the schedule then knows FSDP2's collectives block,
    no streams to overlap them on, as in the run) and gloo's flat rings (its reduce-scatter an
    all-reduce of the whole input), as the run's collectives are."""
    import torch
    return [] if torch.cuda.is_available() else ["run.device=cpu", "algorithm=gloo"]


def project(fw: str, a, out: Path) -> dict:
    cmd = [BENCH, "project", f"model={a.model}", f"model.n_layer={a.layers}", f"framework={fw}", "network=local_gloo",
           "peak_tflops=1", "calibrate=pieces", f"local_batch={a.batch}", f"run.micro_batch={a.batch}",
           f"world_sizes=[{a.ranks}]", f"out={out}", *cpu()]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    doc = json.loads((out / "projection.json").read_text())
    row = doc["rows"][0]
    return {"command": " ".join(cmd[1:]), "step_s": row["step_s"], "optimizer_s": row.get("optimizer_s"),
            "exposed_comm_s": row.get("exposed_comm_s"),
            "factor": (doc.get("framework_timed") or {}).get("factor"),
            "framework_error": (doc.get("framework_timed") or {}).get("error")}


def measure(fw: str, a, out: Path) -> dict:
    cmd = [BENCH, "run", f"framework={fw}", f"model={a.model}", f"model.n_layer={a.layers}", f"launcher.nproc={a.ranks}",
           f"run.global_batch={a.batch * a.ranks}", f"run.micro_batch={a.batch}", "run.warmup_steps=3",
           f"run.measure_steps={a.steps}", "run.progress=false", "logger=none", f"run.dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    rec = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    if rec.get("status") != "ok":
        raise SystemExit(f"{' '.join(cmd)}: {rec.get('status')} {proc.stderr[-2000:]}")
    t = rec["timing"]
    return {"command": " ".join(cmd[1:]), "median_step_s": t["step_time_s"]["median"], "window_step_s": t["window_step_s"]}


def fake_worlds(fw: str, a, worlds: list[int]) -> dict:
    """Rank 0's step of the framework over the fake process group at each world size (the model at the
    5 blocks calibrate=pieces uses, the local batch kept): how the framework factor's numerator moves
    with the world."""
    import copy
    import statistics

    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.project.collectives import time_step
    out = {}
    for w in worlds:
        plan = plan_from_overrides([f"model={a.model}", f"framework={fw}", f"launcher.nproc={w}", "model.n_layer=5",
                                    f"run.global_batch={a.batch * w}", f"run.micro_batch={a.batch}"])
        got = time_step(copy.deepcopy(plan.raw), w, 7)
        out[w] = statistics.median(got["steps_s"]) if "steps_s" in got else got.get("error")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--frameworks", default="ddp,fsdp_full,deepspeed_zero2")
    ap.add_argument("--model", default="llama_tiny")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=1, help="ranks of the run and of the prediction")
    ap.add_argument("--fake-worlds", default="", help="e.g. 1,2,8,64: also rank 0's step over the fake group at each")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    from runs import reuse
    for fw in a.frameworks.split(","):
        reuse(a.out / f"run-{fw}", resume=False)      # an old result here is an error, never reused silently
    rows = []
    print("| framework | predicted step ms | of it optimizer ms | of it exposed comm ms | framework factor "
          "| measured median ms | window ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    for fw in a.frameworks.split(","):
        p = project(fw, a, a.out / f"project-{fw}")
        m = measure(fw, a, a.out / f"run-{fw}")
        err = p["step_s"] / m["median_step_s"] - 1
        rows.append({"framework": fw, "ranks": a.ranks, "predicted": p, "measured": m, "error_vs_median": err})
        factor = f"{p['factor']:.3f}" if p["factor"] else f"- ({p['framework_error']})"
        print(f"| {fw} | {1e3 * p['step_s']:.1f} | {1e3 * (p['optimizer_s'] or 0):.1f} | "
              f"{1e3 * (p['exposed_comm_s'] or 0):.1f} | {factor} | "
              f"{1e3 * m['median_step_s']:.1f} | {1e3 * m['window_step_s']:.1f} | {100 * err:+.1f}% |", flush=True)
    if a.fake_worlds:
        worlds = [int(w) for w in a.fake_worlds.split(",")]
        print("\n| framework | " + " | ".join(f"rank 0's step at {w} (ms)" for w in worlds) + " |")
        print("|---|" + "---|" * len(worlds))
        for row in rows:
            row["fake_worlds_step_s"] = fake_worlds(row["framework"], a, worlds)
            print(f"| {row['framework']} | " + " | ".join(
                f"{1e3 * v:.1f}" if isinstance(v, float) else str(v) for v in row["fake_worlds_step_s"].values()) + " |",
                flush=True)
    (a.out / "pieces_check.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
