"""The first GPU run (issue 16), in one command: on one GPU at world size 1 (NCCL), every
framework variant in fp32 and bf16 on gpt2_small and resnet50, then the checks that need a GPU:

- matmul peak measured on this GPU (bf16, TF32, fp32, host-timed) beside the hardware table's row,
  as a check; every run's MFU on a measured peak is its record's (`record_figures`);
- harness/bare-loop throughput ratio and peak memory against torch.cuda.memory_stats
  (benchmarks/runner_overhead.py --device cuda);
- ZeRO-Offload with DeepSpeed's cpu_adam (deepspeed_zero3_offload is one of the variants);
- the error for 2 ranks on 1 GPU;
- a two-cell `bench sweep` (cells forked from the sweep process, as users' sweeps are) and a
  small `bench advise` (calibration and measurement forked the same way): the paths where a
  process that initialised CUDA before forking breaks every cell (issue 24). Run first: they
  are short.
Exits non-zero when any check fails.

Writes OUT/runs/ (one result.json per cell), OUT/report/ (`bench report`), OUT/checks.json and
OUT/COMMANDS.md (every command as run). A variant that cannot run at one rank (pipeline stages,
tensor-parallel shards) is listed with the reason `bench run` gives.

    python benchmarks/gpu_matrix.py --out reports/gpu-h100
    python benchmarks/gpu_matrix.py --out /tmp/m --device cpu --models gpt2_tiny \\
        --frameworks ddp,deepspeed_zero3_offload --steps 3            # the same path on CPU
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from runs import StaleResult

from ddlbench.record import rundir

REPO = Path(__file__).resolve().parents[1]

MODELS = ("gpt2_small", "resnet50")
PARTS = ("fork", "cells", "nproc2", "overhead", "report")
PRECISIONS = ("fp32", "bf16")
# a run that ends at its own run.timeout_s still writes its record (a timed-out offload cell took 12.6-13.6 s
# more on the H200): the harness kills a cell only this long after that
RECORD_GRACE_S = 30


def variants() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "framework").glob("*.yaml"))


def cells(frameworks: list[str], models: list[str], precisions: list[str]) -> list[tuple[str, str, str, tuple]]:
    return [(f, m, p, ()) for m in models for p in precisions for f in frameworks]


def parse_cell(spec: str) -> tuple[str, str, str, tuple]:
    """'FW MODEL PREC [key=value ...]' -> (fw, model, precision, overrides)."""
    words = spec.split()
    if len(words) < 3 or any("=" not in w for w in words[3:]):
        raise ValueError(f"--cell {spec!r}: expected 'FRAMEWORK MODEL PRECISION [key=value ...]'")
    return words[0], words[1], words[2], tuple(words[3:])


def cell_name(fw: str, model: str, prec: str, overrides: tuple) -> str:
    """A directory name for a cell: its overrides' last key parts and values, path-safe."""
    tail = [f"{k.rsplit('.', 1)[-1]}_{v}" for k, v in (o.split("=", 1) for o in overrides)]
    return "-".join([fw, model, prec, *tail]).replace("/", "_")


def merged(common: list[str], overrides: tuple) -> list[str]:
    """The common overrides, less the keys a cell sets itself, then the cell's."""
    mine = {o.split("=", 1)[0] for o in overrides}
    return [c for c in common if c.split("=", 1)[0] not in mine] + list(overrides)


def cell_kill_s(overrides: list[str]) -> float:
    """How long the harness lets a cell's `bench run` go: its own run.timeout_s (the last one given,
    as Hydra reads them) and RECORD_GRACE_S for the record it writes on its timeout."""
    timeouts = [float(o.split("=", 1)[1]) for o in overrides if o.startswith("run.timeout_s=")]
    if not timeouts:
        raise ValueError("a cell's overrides must give run.timeout_s (the harness's kill follows from it)")
    return timeouts[-1] + RECORD_GRACE_S


def keep(prefix: Path | None, checks: dict, rec: dict | None = None, name: str = "") -> None:
    """--keep PREFIX: as each cell ends, its record appended to PREFIX.records.jsonl (flushed to disk)
    and the rows so far to PREFIX.checks.json, so a call killed at its limit returns every record it
    finished (the device tool brings back what is under $OUT, at most 8 files)."""
    if prefix is None:
        return
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if rec is not None:
        with open(f"{prefix}.records.jsonl", "a") as f:
            f.write(json.dumps({"cell": name, "record": rec}) + "\n")
            f.flush()
            os.fsync(f.fileno())
    tmp = Path(f"{prefix}.checks.json.tmp")
    tmp.write_text(json.dumps(checks, indent=1))
    tmp.replace(f"{prefix}.checks.json")


def expand_plan(argv: list[str]) -> list[str]:
    """`--plan STEP`: that step of benchmarks/gpu_plan.py, as the arguments it stands for."""
    if "--plan" not in argv:
        return argv
    i = argv.index("--plan")
    from gpu_plan import STEPS
    return [*argv[:i], *STEPS[argv[i + 1]].matrix_args(), *argv[i + 2:]]


def record_figures(rec: dict) -> dict:
    """A cell's row from its record alone: the figures as the record states them, the MFU on the
    measured peak included (the record's `flops.mfu_on_measured_peak` on its own
    `measured_peak_per_device`), so checks.json never restates a figure on another peak (this
    script's host-timed `matmul_peak_flops` once gave one run 79.1% where its record says 66.5%)."""
    flops = rec.get("flops") or {}
    return {"samples_per_s": rec["throughput"]["samples_per_s"], "mfu": rec.get("mfu"),
            "tokens_per_s": rec["throughput"].get("tokens_per_s"),
            "micro_batch": (rec.get("parallel") or {}).get("micro_batch"),
            "compile_s": (rec.get("startup_s") or {}).get("compile_s"),
            "peak_dtype": flops.get("peak_dtype"), "table_peak": flops.get("peak_per_device"),
            "peak_source": flops.get("peak_source"),
            "measured_peak": flops.get("measured_peak_per_device"),
            "measured_peak_source": flops.get("measured_peak_source"),
            "mfu_measured_peak": flops.get("mfu_on_measured_peak"),
            "peak_allocated_bytes": rec["memory"]["per_rank"][0].get("peak_allocated_bytes"),
            "energy_per_sample_j": (rec.get("gpu") or {}).get("energy_per_sample_j")}


def matmul_peak(device: str, dtype_name: str, n: int = 8192, seconds: float = 2.0) -> float:
    """Dense matmul FLOP/s measured here: n x n x n products back to back for ~seconds."""
    import torch
    dtype = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}[dtype_name]
    if device == "cpu":   # the probe the runs' own CPU MFU uses
        from ddlbench.machine.hardware import probe_cpu_matmul
        return probe_cpu_matmul(torch.get_num_threads(), dtype, seconds=seconds)
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize
    for _ in range(3):
        a @ b
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        count += 10
        sync()
    return 2 * n ** 3 * count / (time.perf_counter() - start)


def matmul_peak_events(n: int, reps: int = 50) -> float:
    """bf16 n x n x n products timed with CUDA events: the probe runs record beside MFU
    (ddlbench.machine.hardware.probe_gpu_matmul), one shape at a time."""
    import torch

    from ddlbench.machine.hardware import probe_gpu_matmul
    return probe_gpu_matmul(torch.device("cuda"), torch.bfloat16, shapes=(n,), reps=reps)


def sweep_ok(check: dict) -> bool:
    """Both cells of the two-cell sweep trained."""
    return len(check.get("cells", [])) == 2 and all(c["status"] == "ok" for c in check["cells"])


def advise_ok(check: dict) -> bool:
    """bench advise exited 0 having measured its candidates and recommended one."""
    return not check.get("error") and check.get("phase") == "done" and bool(check.get("recommendation"))


def nproc2_refused(check: dict) -> bool:
    """2 ranks on 1 GPU ended `failed` with the one-rank-per-GPU reason, before training."""
    return check.get("status") == "failed" and "launcher.nproc=2 but 1 GPU" in (check.get("message") or "")


def fork_checks(out: Path, device: str, log: list[str], timeout: float) -> dict:
    """The sweep and advise paths, whose cells are forked (ddlbench/machine/gpus.py)."""
    d = out / "sweep"
    why = bench(["sweep", "--dir", str(d), "framework=ddp", "model=gpt2_tiny", "launcher.nproc=1",
                 "run.global_batch=4,8", "debug=fast", f"run.device={device}", f"run.timeout_s={timeout}"],
                log, 3 * timeout)
    recs = [json.loads(p.read_text()) for p in sorted(d.rglob("result.json")) if ".attempts" not in p.parts]
    sweep = {"error": why, "cells": [{"run_id": r["run_id"], "status": r["status"], "precision": r["precision"],
                                      "error": (r.get("error") or {}).get("message")} for r in recs]}
    d = out / "advise"
    why = bench(["advise", "model=gpt2_tiny", "devices=1", "frameworks=ddp,fsdp_full", "budget_runs=2",
                 "logger=none", f"dir={d}", f"run.device={device}", f"run.timeout_s={timeout}"], log, 6 * timeout)
    advice = json.loads((d / "advice.json").read_text()) if (d / "advice.json").exists() else {}
    advise = {"error": why, "phase": advice.get("phase"), "precision": advice.get("precision"),
              "network": advice.get("network"), "recommendation": advice.get("recommendation")}
    return {"sweep": sweep, "sweep_ok": sweep_ok(sweep), "advise": advise, "advise_ok": advise_ok(advise)}


def bench(args: list[str], log: list[str], timeout: float, env: dict | None = None) -> str:
    """Run `bench ARGS`; '' when it exited, else why not (its last error line, or the timeout)."""
    cmd = [sys.executable, "-m", "ddlbench.cli", *args]
    log.append(" ".join([*(f"{k}={v}" for k, v in (env or {}).items()), "bench", *args]))
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return f"no result: bench ran past {timeout:g} s"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1][:300] if proc.returncode and lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--frameworks", default="all", help="comma list, or all (every conf/framework variant)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--cell", action="append", default=[], metavar="'FW MODEL PREC [key=value ...]'",
                    help="one cell with its own overrides (repeatable); replaces the frameworks x models grid")
    ap.add_argument("--overhead", action="append", default=[], metavar="'MODEL PRECISION BATCH [compile] [repeats=N]'",
                    help="a runner-vs-reference-loop comparison (repeatable); default: the first model, fp32")
    ap.add_argument("--project", action="append", default=[], metavar="'KEY=VALUE ...'",
                    help="a `bench project` specification run here, e.g. with calibrate=pieces: compute per piece "
                         "timed on this GPU (repeatable; its projection.json under projections/)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma list of {','.join(PARTS)} (the matmul peak is always measured)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds from the first cell's start (after the probes) after which no further cell "
                         "starts (rows listed as not_run)")
    ap.add_argument("--project-timeout", type=float, default=360, help="seconds per --project run")
    ap.add_argument("--keep", type=Path, default=None, metavar="PREFIX",
                    help="as each cell ends: its record appended to PREFIX.records.jsonl, the rows to PREFIX.checks.json")
    a = ap.parse_args(expand_plan(sys.argv[1:]))
    parts = set(a.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts: unknown {sorted(parts - set(PARTS))}; choose from {','.join(PARTS)}")
    # the cells share one memory-profile cache, as a sweep's do: run.micro_batch=auto profiles a model once
    # per (model, precision, device) for the whole call, not once per cell (12.7-21.4 s a cell on the H200)
    os.environ.setdefault(rundir.PROFILE_CACHE_ENV, str((a.out / "profile-cache").resolve()))
    runs = a.out / "runs"
    if runs.exists() and any(runs.rglob("result.json")):
        raise StaleResult(f"{runs} already holds a result.json from an earlier run: choose an empty --out")
    a.out.mkdir(parents=True, exist_ok=True)
    frameworks = variants() if a.frameworks == "all" else a.frameworks.split(",")
    common = [f"run.device={a.device}", "launcher.nproc=1", f"run.global_batch={a.global_batch}",
              f"run.measure_steps={a.steps}", "run.warmup_steps=3", "logger=none", "run.progress=false",
              f"run.timeout_s={a.timeout}"]
    log: list[str] = []
    checks: dict = {"device": a.device, "cells": []}

    import torch
    if a.device == "cuda":
        checks["gpu"] = torch.cuda.get_device_name(0)
    dtypes = ("bf16", "tf32", "fp32") if a.device == "cuda" else ("bf16", "fp32")   # flops.peak_dtype's values
    checks["matmul_peak_flops"] = {d: matmul_peak(a.device, d) for d in dtypes}
    print("measured matmul peak:", {k: f"{v / 1e12:.1f} TFLOP/s" for k, v in checks["matmul_peak_flops"].items()})
    if a.device == "cuda":
        checks["matmul_bf16_events"] = {str(n): matmul_peak_events(n) for n in (4096, 8192, 16384)}
        print("bf16 matmul, CUDA events:", {k: f"{v / 1e12:.1f}" for k, v in checks["matmul_bf16_events"].items()})
    if "fork" in parts:
        checks.update(fork_checks(a.out, a.device, log, a.timeout))
        save(a.out, checks)
        keep(a.keep, checks)
        print(f"two-cell sweep: {'ok' if checks['sweep_ok'] else 'FAILED'}; "
              f"advise: {'ok' if checks['advise_ok'] else 'FAILED'}", flush=True)

    grid = [parse_cell(c) for c in a.cell] or cells(frameworks, a.models.split(","), a.precisions.split(","))
    todo = grid if "cells" in parts else []
    checks["not_run"] = []
    # the deadline counts from here: gpu_plan.worst_case_s prices the probes apart (an H200's probes of
    # 2026-11-30 outran step P's 10 s, measured from the start, and its one cell never ran)
    started = time.monotonic()
    for i, (fw, model, prec, overrides) in enumerate(todo, 1):
        name = cell_name(fw, model, prec, overrides)
        if a.deadline is not None and time.monotonic() - started > a.deadline:
            checks["not_run"].append(name)
            continue
        cell_start = time.monotonic()
        d = runs / name
        over = merged(common, overrides)
        why = bench(["run", f"framework={fw}", f"model={model}", f"run.precision={prec}", f"run.dir={d}", *over],
                    log, cell_kill_s(over))
        rec = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
        row = {"framework": fw, "model": model, "precision": prec, "overrides": list(overrides),
               "status": rec["status"] if rec else "no result"}
        if rec is None:
            row["error"] = why   # refused before a run (exit 2: the config's one line), or the timeout
        if rec and rec["status"] == "ok":
            row.update(record_figures(rec))
        elif rec:
            row["error"] = (rec.get("error") or {}).get("message", "")[:300]
        row["wall_s"] = round(time.monotonic() - cell_start, 1)
        checks["cells"].append(row)
        save(a.out, checks)   # a matrix stopped half-way keeps the rows it made
        keep(a.keep, checks, rec, name)
        print(f"[{i}/{len(todo)}] {name}: {row['status']} ({row['wall_s']} s)"
              + (f" {row['samples_per_s']:.1f} samples/s" if row.get("samples_per_s") else "")
              + (f" -- {row['error'][:160]}" if row.get("error") else ""), flush=True)
    if checks["not_run"]:
        print(f"not run (past --deadline {a.deadline:g} s): {', '.join(checks['not_run'])}")

    if a.device == "cuda" and "nproc2" in parts:   # 2 ranks on one GPU must be refused with the reason
        d = runs / "nproc2-on-one-gpu"
        why = bench(["run", "framework=ddp", "model=gpt2_small", f"run.dir={d}", *common[:1], "launcher.nproc=2",
                     *common[2:]], log, a.timeout + RECORD_GRACE_S, env={"CUDA_VISIBLE_DEVICES": "0"})
        rec = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
        checks["nproc2_on_one_gpu"] = {"status": rec.get("status", "no result"),
                                       "message": (rec.get("error") or {}).get("message") or why}
        checks["nproc2_on_one_gpu"]["refused"] = nproc2_refused(checks["nproc2_on_one_gpu"])
        print("2 ranks on 1 GPU:", checks["nproc2_on_one_gpu"])
    if "overhead" in parts:
        specs = a.overhead or [f"{a.models.split(',')[0]} fp32 {a.global_batch}"]
        checks["runner_overhead"] = []
        for i, spec in enumerate(specs):
            model, prec, batch, *flags = spec.split()
            out = a.out / f"runner_overhead_{i}.json"
            cmd = [sys.executable, "benchmarks/runner_overhead.py", "--model", model, "--nproc", "1", "--device",
                   a.device, "--precision", prec, "--global-batch", batch, "--steps", str(max(a.steps, 5)),
                   "--repeats", next((f.split("=")[1] for f in flags if f.startswith("repeats=")), "3"),
                   "--json", str(out), *(["--compile"] if "compile" in flags else [])]
            log.append(" ".join(["python", *cmd[1:]]))
            try:
                subprocess.run(cmd, cwd=REPO, check=True, timeout=3 * 2 * (a.timeout + 60))
                checks["runner_overhead"].append(json.loads(out.read_text()))
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                checks["runner_overhead"].append({"spec": spec, "error": str(exc)})
            print("runner overhead:", checks["runner_overhead"][-1], flush=True)
            save(a.out, checks)
            keep(a.keep, checks)
    if a.project:    # after the cells: a projection times pieces on the GPU the cells were measured on
        checks["projections"] = []
        for i, spec in enumerate(a.project):
            out = a.out / "projections" / str(i)
            why = bench(["project", *shlex.split(spec), f"out={out}"], log, a.project_timeout)
            doc = json.loads((out / "projection.json").read_text()) if (out / "projection.json").exists() else {}
            checks["projections"].append({"spec": spec, "error": why, "efficiency_source": doc.get("efficiency_source"),
                                          "rows": [{k: r.get(k) for k in ("devices", "step_s", "tokens_per_s_per_device",
                                                                          "mfu", "memory_per_rank_bytes")}
                                                   for r in doc.get("rows", [])]})
            print("projection:", checks["projections"][-1], flush=True)
            save(a.out, checks)
            keep(a.keep, checks)
    report_error = ""
    if "report" in parts and runs.exists():
        report_error = bench(["report", str(runs), "--out", str(a.out / "report")], log, 600)
    if report_error:
        checks["report_error"] = report_error
    save(a.out, checks)
    (a.out / "COMMANDS.md").write_text("# Commands, as run by benchmarks/gpu_matrix.py\n\n```\n"
                                       + shlex.join(["python", *sys.argv]) + "\n" + "\n".join(log) + "\n```\n")
    bad = [c for c in checks["cells"] if c["status"] not in ("ok", "unsupported")]
    ratios = [r.get("ratio") for r in checks.get("runner_overhead") or []]
    ratio = None if not ratios or None in ratios else ratios
    print(f"{len(checks['cells']) - len(bad)}/{len(checks['cells'])} cells ok or unsupported with a reason; "
          f"runner/reference {ratio if ratio is None else [round(r, 3) for r in ratio]}; written to {a.out}")
    failed = [name for name, part, ok in (
        ("cells", "cells", not bad), ("runner_overhead", "overhead", ratio is not None),
        ("report", "report", not report_error), ("sweep", "fork", checks.get("sweep_ok")),
        ("advise", "fork", checks.get("advise_ok")),
        ("nproc2_on_one_gpu", "nproc2", a.device != "cuda" or (checks.get("nproc2_on_one_gpu") or {}).get("refused")),
        ("projections", "cells", not any(p["error"] for p in checks.get("projections") or [])))
        if part in parts and not ok]
    checks["failed_checks"] = failed
    save(a.out, checks)
    keep(a.keep, checks)
    print("failed checks: " + (", ".join(failed) if failed else "none"))
    return int(bool(failed))


def save(out: Path, checks: dict) -> None:
    tmp = out / "checks.json.tmp"
    tmp.write_text(json.dumps(checks, indent=1))
    tmp.replace(out / "checks.json")


if __name__ == "__main__":
    sys.exit(main())
