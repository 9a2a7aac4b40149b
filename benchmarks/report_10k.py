"""How long `bench report` takes on 10,000 result files (target: under 10 s).

Clones one real result.json (with its per-step series, evaluations and config) into N run
directories that vary framework, world size, repeat, throughput and status, then times
report.build once, end to end (load, tables, plots, csv/md/html), and each stage.

  .venv/bin/python benchmarks/report_10k.py reports/example/runs/<any run>/result.json [N]
"""
from __future__ import annotations

import copy
import json
import random
import sys
import tempfile
import time
from pathlib import Path

FRAMEWORKS = [("ddp", "default"), ("fsdp2", "full"), ("deepspeed", "zero2"), ("deepspeed", "zero3"),
              ("horovod", "default"), ("fairscale", "oss_ddp")]
SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def clone(template: dict, i: int, rng: random.Random) -> dict:
    rec = copy.deepcopy(template)
    fw, variant = FRAMEWORKS[i % len(FRAMEWORKS)]
    world = SIZES[(i // len(FRAMEWORKS)) % len(SIZES)]
    repeat = i // (len(FRAMEWORKS) * len(SIZES))
    rec["run_id"] = f"run{i:05d}"
    rec["framework"].update(name=fw, variant=variant)
    rec["config"]["framework"].update(name=fw, variant=variant)
    rec["config"]["launcher"]["nproc"] = world
    rec["config"]["run"]["repeat"] = repeat
    rec["parallel"]["world_size"] = world
    rec["throughput"]["samples_per_s"] *= world * rng.uniform(0.6, 1.0)
    if i % 97 == 0:
        rec["status"], rec["error"] = "failed", {"type": "exception", "message": "injected", "rank": 1}
    return rec


def main(template_path: str, n: int = 10_000) -> None:
    from ddlbench import report
    from ddlbench.record.results import find_results
    from ddlbench.report import plots
    from ddlbench.report.frame import summary_frame
    from ddlbench.report.load import load_records, paused_gc

    template = json.loads(Path(template_path).read_text())
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        for i in range(n):
            d = root / f"run{i:05d}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps(clone(template, i, rng)))
        size = sum(p.stat().st_size for p in root.rglob("result.json"))
        print(f"{n} result files, {size / 2**20:.0f} MiB")
        t0 = time.perf_counter()
        rep = report.build([str(root)], Path(tmp) / "out", progress=False)
        total = time.perf_counter() - t0
        with paused_gc():
            t = time.perf_counter()
            files = find_results([str(root)])
            recs = load_records(files, progress=False)
            t_load = time.perf_counter() - t
            t = time.perf_counter()
            df = summary_frame(recs, [str(f.parent) for f in files])
            t_frame = time.perf_counter() - t
        t = time.perf_counter()
        plots.throughput(rep.cells, Path(tmp) / "out")
        t_plot = time.perf_counter() - t
        print(f"bench report: {total:.2f} s total for {len(rep.summary)} runs, {len(rep.cells)} configurations "
              f"(stages, timed again separately: find+load {t_load:.2f} s, summary table {t_frame:.2f} s, "
              f"one plot {t_plot:.2f} s); target < 10 s: {'met' if total < 10 else 'NOT met'}")
        assert len(df) == n


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10_000)
