"""bench advise's memory estimator against torch's MemTracker, for every data-parallel strategy and
for tensor and pipeline parallelism at 2, on a GPT-2 with its real vocabulary (gpt2_small's 50,257
tokens and 768 wide, 2 blocks, 128 tokens: the embedding and head are most of the model, as the
issue asks), 2 ranks on this machine's CPU.

    .venv/bin/python benchmarks/memory_check.py OUT_DIR [--resume] [--only ddp,fsdp_full]
        [--layers 2] [--seq-len 128] [--global-batch 4] [--precision fp32|bf16] [--model gpt2_small]
        [--ac none,full,selective_layer:2,selective_op]

Each configuration runs `bench run ... run.memory_tracker=true` (ddlbench/rank/memtrack.py: every tensor
storage on the rank from before setup to the end of the loop); the busiest rank's peak after the
first step is set beside `ddlbench.estimate.memcheck.predicted` (what advise would estimate for that
candidate). Writes OUT_DIR/memory_check.json and .md; exit 1 when any estimate is off by more than
10%."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import reuse  # noqa: E402

RUN = ["launcher.nproc=2", "run.warmup_steps=1", "run.measure_steps=2", "run.memory_tracker=true", "run.comm_profile=false", "run.progress=false", "logger=none"]
# every data-parallel strategy (one yaml each), then model parallelism at 2
CASES = {
    "ddp": [], "ddp_local_sgd": [], "daso": [], "horovod": [],
    "fairscale_oss": [], "fairscale_oss_ddp": [], "fairscale_fsdp": [],
    "fsdp_full": [], "fsdp_grad_op": [], "fsdp_offload": [],
    "deepspeed_zero0": [], "deepspeed_zero1": [], "deepspeed_zero2": [], "deepspeed_zero3": [],
    "deepspeed_zero3_offload": [],
    "tensor_parallel": [], "pipeline_1f1b": [],
}
LIMIT = 0.10


def run_one(out: Path, name: str, extra: list[str], resume: bool, framework: str | None = None) -> dict:
    run_dir = out / name
    if not reuse(run_dir, resume):
        subprocess.run([sys.executable, "-m", "ddlbench.cli", "run", f"framework={framework or name}", *extra,
                        f"run.dir={run_dir}"], check=False, timeout=900)
    return json.loads((run_dir / "result.json").read_text())


def check(name: str, record: dict) -> dict:
    from ddlbench.estimate.memcheck import compare
    from ddlbench.planning.config import validate
    if record["status"] != "ok":
        return {"framework": name, "status": record["status"],
                "error_message": (record.get("error") or {}).get("message", "")[:200]}
    return {"status": "ok", **compare(record, validate(record["config"])), "framework": name}


def markdown(rows: list[dict]) -> str:
    mib = 1 << 20
    out = ["| framework | layout | estimate (MiB) | tracker peak (MiB) | error | estimate's parts (MiB) |",
           "|---|---|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            out.append(f"| {r['framework']} | | | | {r['status']} | {r['error_message']} |")
            continue
        e = r["estimate"]
        parts = ", ".join(f"{k} {e[k] / mib:.0f}" for k in ("params", "grads", "optimizer", "activations",
                                                            "temporaries", "buffers", "host") if e.get(k))
        parts += "".join(f"; not seen by the tracker: {k} {v / mib:.0f}" for k, v in e["unseen_by_tracker"].items())
        out.append(f"| {r['framework']} | {r['layout']} | {e['compared'] / mib:.0f} | "
                   f"{r['measured']['peak_bytes'] / mib:.0f} | {r['error']:+.1%} | {parts} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=4, help="over 2 ranks")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--model", default="gpt2_small")
    ap.add_argument("--ac", default="", help="activation checkpointing policies, e.g. none,full,selective_layer:2,"
                    "selective_op: each framework of --only under each (DeepSpeed with 1M-element buckets, whose "
                    "500M default would hide the activations)")
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(CASES)
    common = [f"model={a.model}", f"model.n_layer={a.layers}", f"model.seq_len={a.seq_len}",
              f"run.global_batch={a.global_batch}", f"run.precision={a.precision}", *RUN]
    extra = {name: CASES.get(name, []) for name in names}
    if a.ac:
        small = ["framework.options.reduce_bucket_size=1000000", "framework.options.allgather_bucket_size=1000000"]
        extra = {f"{name}@{pol}": [*CASES.get(name, []), f"framework.options.activation_checkpointing={pol}",
                                   *(small if name.startswith("deepspeed") else [])]
                 for name in names for pol in a.ac.split(",")}
    rows = []
    for name, more in extra.items():
        fw = name.split("@")[0]
        rows.append(check(fw, run_one(a.out, name.replace(":", "_").replace("@", "-"), [*common, *more], a.resume, fw)))
        rows[-1]["framework"] = name
        r = rows[-1]
        print(f"{name:26s} " + (f"{r['error']:+.1%}" if r["status"] == "ok" else r["status"]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "memory_check.json").write_text(json.dumps(rows, indent=1, default=str))
    (a.out / "memory_check.md").write_text(markdown(rows))
    print(markdown(rows))
    return int(any(r["status"] not in ("ok", "unsupported") or abs(r.get("error", 0)) > LIMIT for r in rows))


if __name__ == "__main__":
    sys.exit(main())
