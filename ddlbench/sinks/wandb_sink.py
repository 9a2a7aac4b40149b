"""Log one finished run to W&B: config, per-step metrics, summary. Offline unless the config
says online. `python -m ddlbench.sinks.wandb_sink RUN_DIR`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ddlbench.record.results import load_result
from ddlbench.record.rundir import RunDir


def flat_summary(record: dict) -> dict:
    t = record.get("timing") or {}
    tp = record.get("throughput") or {}
    mem = (record.get("memory") or {}).get("per_rank") or []
    comm = record.get("comm") or {}
    out = {
        "status": record["status"],
        "throughput/samples_per_s": tp.get("samples_per_s"),
        "throughput/tokens_per_s": tp.get("tokens_per_s"),
        "throughput/samples_per_s_per_device": tp.get("samples_per_s_per_device"),
        "mfu": record.get("mfu"),
        "memory/peak_rss(bytes)": max((m.get("peak_rss_bytes") or 0 for m in mem), default=None),
        "memory/peak_allocated(bytes)": max((m.get("peak_allocated_bytes") or 0 for m in mem), default=None),
        "memory/model_state_theory(bytes)": (record.get("memory") or {}).get("model_state_bytes_per_rank_theory"),
        "comm/bytes_per_step": sum((comm.get("per_step_bytes") or {}).values()) or None,
        "comm/wire_bytes_per_rank": comm.get("wire_bytes_per_rank"),
        "comm/analytic_wire_bytes_per_rank": comm.get("analytic_wire_bytes_per_rank"),
        "comm/exposed_s": ((comm.get("time") or {}).get("total") or {}).get("exposed_s"),
        "grad_reduce_dtype": (record.get("framework") or {}).get("grad_reduce_dtype"),
    }
    for k, v in (t.get("step_time_s") or {}).items():
        out[f"step_time/{k}(s)"] = v
    conv = record.get("convergence") or {}
    for key in ("time_to_target_s", "epochs_to_target"):
        if conv.get(key) is not None:
            out[f"quality/{key}"] = conv[key]
    if record.get("error"):
        out["error"] = record["error"].get("message")
    return {k: v for k, v in out.items() if v is not None}


def step_rows(run_path: Path, record: dict) -> dict[int, dict]:
    """Per-step train metrics (metrics.jsonl) merged with the evaluations (val/*) by step, so
    W&B receives increasing steps only."""
    rows: dict[int, dict] = {}
    metrics = RunDir(run_path).metrics
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            rows[row["step"]] = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
    for e in (record.get("convergence") or {}).get("eval") or []:
        rows.setdefault(e["step"], {}).update(
            {f"val/{k}": e[k] for k in ("loss", "accuracy", "epoch", "time_s") if e.get(k) is not None})
    return rows


def main(run_dir: str, mode: str | None = None) -> int:
    import wandb

    run_path = Path(run_dir)
    record = load_result(run_path)
    lg = {**record["config"]["logger"], **({"mode": mode} if mode else {})}
    # No system metadata (it holds the command line and host details), no code, git or
    # requirements capture: what W&B stores is the record's config and metrics, nothing else.
    settings = wandb.Settings(init_timeout=float(lg["init_timeout_s"]), console="off", silent=True,
                              x_disable_stats=True, x_disable_meta=True, save_code=False, disable_code=True,
                              disable_git=True, disable_job_creation=True, x_save_requirements=False)
    run = wandb.init(project=lg["project"], entity=lg.get("entity"), mode=lg["mode"],
                     dir=str(run_path), name=record["run_id"], id=None, config=record["config"],
                     group=record["model"]["name"], job_type=record["framework"]["name"],
                     tags=[record["status"]], settings=settings, reinit="finish_previous")
    for step, row in sorted(step_rows(run_path, record).items()):
        run.log(row, step=step)
    run.summary.update(flat_summary(record))
    run.finish()
    print(f"W&B ({lg['mode']}): {run.dir if lg['mode'] != 'online' else run.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
