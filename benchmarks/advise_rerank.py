"""An exhaustive advise grid (`bench advise ... evaluate=all`, its advice.json) ranked again by
another predictor, against the same measurements: what a change to the predictor does to the
advice's regret without running the grid again.

    .venv/bin/python benchmarks/advise_rerank.py reports/advise-eval/*/advice.json

Predictors compared:
- `sum`: what the grid recorded (ddlbench/estimate/step.py: calibrated compute + every collective
  of the cost model, no overlap);
- `schedule`: the same calibrated compute, the step simulated by the rules of `bench project`
  (ddlbench/estimate/scale.py, rules.py: DDP's buckets during backward, FSDP2's prefetched gathers
  and reduce-scatters per unit, ZeRO's buckets, TP's exposed all-reduces) on the grid's network;
  families without rules (pipelines: their flow shop is step.py's already; Horovod, FairScale, ...)
  keep `sum`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def scheduled(c: dict, state: dict, prof, network, algorithm: str) -> float | None:
    """The candidate's step through the schedule with its calibrated compute (None: no rules)."""
    from ddlbench.errors import ConfigError
    from ddlbench.estimate.scale import Pricing, schedule_step
    from ddlbench.planning.config import plan_from_overrides
    overrides = [o for o in c["overrides"] if not o.startswith(("launcher=", "launcher.nodes="))] + ["run.device=cpu"]
    try:
        plan = plan_from_overrides(overrides)
    except ConfigError as exc:
        print(f"  {c['label']}: not planned here: {exc}", file=sys.stderr)
        return None
    out = schedule_step(plan, prof, Pricing(network, algorithm), c["predicted"]["compute_s"],
                        "full" if c["layout"].get("checkpointing") else "none", state["devices_per_node"])
    return out and out["step_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("advice", nargs="+", type=Path)
    a = ap.parse_args()
    from ddlbench.adapters.cost import ModelProfile
    from ddlbench.advise.regret import evaluate
    from ddlbench.network.model import backend_algorithm, load
    for path in a.advice:
        state = json.loads(path.read_text())
        net = path.parent / "network.yaml"
        network = load(str(net) if net.is_file() else state["network"])
        algorithm = state["options"].get("algorithm", "auto")
        if algorithm == "auto":
            algorithm = backend_algorithm("gloo" if state["device"] == "cpu" else "nccl")
        prof = ModelProfile.from_dict(state["profile"])
        rows = [c for c in state["candidates"] if c.get("rank") and c.get("measured")]
        measured = [c["measured"]["step_s"] if c["measured"]["status"] == "ok" else math.inf for c in rows]
        ps = [c["predicted"]["step_s"] for c in rows]
        pq = [scheduled(c, state, prof, network, algorithm) or c["predicted"]["step_s"] for c in rows]
        print(f"{path.parent.name}: {len(rows)} candidates, network {network.name}, budget {state['options']['budget_runs']}")
        for name, pred in (("sum", ps), ("schedule", pq)):
            e = evaluate(pred, measured, budget=state["options"]["budget_runs"])
            r = " / ".join(f"{v:.3f}" for v in e["regret"].values())
            order = sorted(range(len(rows)), key=lambda i: pred[i])
            print(f"  {name:9s} regret@{'/'.join(e['regret'])}: {r}; tau-b {e['kendall_tau_b']:.2f}; "
                  f"first {rows[order[0]]['label']} ({pred[order[0]] * 1e3:.1f} ms predicted, "
                  f"{measured[order[0]] * 1e3:.1f} measured; best {e['best_measured'] * 1e3:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
