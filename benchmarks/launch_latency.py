"""How long until the first training step? Runs `bench run` (gpt2_tiny, 10 steps, logger=none)
as a user would, cold (a new `bench` process each time) at 1 and 2 ranks, and warm (the second
cell of one `bench run -m`, which the sweep and multirun paths see for every cell after the
first), and prints each start-up phase from the run's timeline (<run>/events.jsonl, see
ddlbench/lifecycle/events.py), next to the import floors measured in the same session:
`python -c "import torch"` and `python -c "import torch, <the GPT-2 module>"`.

    .venv/bin/python benchmarks/launch_latency.py [--repeats 3] [--out DIR]

Medians over the repeats. Start-up time is machine-bound: compare numbers from one session.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from ddlbench.lifecycle import events  # noqa: E402

BENCH = str(Path(sys.executable).with_name("bench"))
RUN = ["model=gpt2_tiny", "logger=none", "run.progress=false", "run.warmup_steps=1", "run.measure_steps=9"]


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - t0


def cold(out: Path, nproc: int) -> dict:
    t0 = time.perf_counter()
    subprocess.run([BENCH, "run", *RUN, f"launcher.nproc={nproc}", f"run.dir={out}"], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=REPO)
    return {**events.phases(events.read(out)), "command_exit": time.perf_counter() - t0}


def warm(out: Path, nproc: int) -> dict:
    """Phases of the second cell of `bench run -m run.seed=0,1` (cell start -> first step)."""
    subprocess.run([BENCH, "run", "-m", *RUN, f"launcher.nproc={nproc}", "run.seed=0,1", f"run.dir={out}"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=REPO)
    second = sorted(p for p in out.iterdir() if p.is_dir())[1]
    return events.phases(events.read(second))


def median_of(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="launch_latency_"))
    py = sys.executable
    floors = {
        "python -c 'import torch'": [wall([py, "-c", "import torch"]) for _ in range(args.repeats)],
        "python -c 'import torch, transformers GPT-2'": [
            wall([py, "-c", "import torch, transformers.models.gpt2.modeling_gpt2"]) for _ in range(args.repeats)],
    }
    floors = {k: statistics.median(v) for k, v in floors.items()}
    cols = {}
    for nproc in (1, 2):
        cols[f"cold {nproc} rank{'s' if nproc > 1 else ''}"] = median_of(
            [cold(out / f"cold{nproc}_{i}", nproc) for i in range(args.repeats)])
    cols["warm 2 ranks"] = median_of([warm(out / f"warm2_{i}", 2) for i in range(args.repeats)])

    names = [name for name, _ in events.PHASES] + ["total_to_first_step", "command_exit"]
    print(f"gpt2_tiny, 10 steps, median of {args.repeats}; seconds")
    print(f"{'phase':<22}" + "".join(f"{c:>16}" for c in cols))
    for name in names:
        cells = [f"{cols[c][name]:16.2f}" if name in cols[c] else f"{'-':>16}" for c in cols]
        print(f"{name:<22}" + "".join(cells))
    torch_s = floors["python -c 'import torch'"]
    for k, v in floors.items():
        print(f"{k:<48} {v:6.2f} s")
    for c, row in cols.items():
        print(f"{c}: first step {row['total_to_first_step']:.2f} s = {row['total_to_first_step'] / torch_s:.2f} x import torch")
    (out / "launch_latency.json").write_text(json.dumps({"floors_s": floors, "phases_s": cols}, indent=2))
    print(f"runs and launch_latency.json under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
