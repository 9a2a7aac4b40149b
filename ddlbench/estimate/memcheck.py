"""The memory estimator (ddlbench/estimate/memory.py) against an independent measurement: torch's
MemTracker around a real run of the same configuration (`run.memory_tracker=true`, ddlbench/rank/memtrack.py).
What `bench advise` prunes and ranks by is only as good as this agreement.

`predicted(plan)` is exactly what advise computes for that candidate (its adapter's cost model, the
model's meta-device profile, estimate()); `compare(record, plan)` puts it beside the busiest rank's
tracked peak. On CPU the device is the host, so what a framework offloads counts on both sides.
"""
from __future__ import annotations

from ddlbench.estimate.memory import Layout, estimate
from ddlbench.estimate.profile import profile

# buffers a library allocates where torch's dispatcher does not see it: not in the tracker's peak
UNSEEN = {"fusion buffer": "Horovod allocates it from its background thread"}


def layout_of(plan, shard_ranks: int) -> Layout:
    d = plan.dims
    ckpt = plan.variant.ac_policy()
    return Layout(plan.cfg.framework.name, dp=d.dp, tp=d.tp, pp=d.pp, micro_batch=d.micro_batch,
                  grad_accum=d.grad_accum, checkpointing=ckpt, shard=shard_ranks if shard_ranks < d.dp else 0, cp=d.cp)


def cost_of_plan(plan, prof, per_node: int | None = None):
    return plan.variant.cost_model(plan.dims, prof, plan.cfg.run.precision, per_node)


def estimate_plan(plan, prof, cost, device: str) -> dict:
    """estimate() for this plan's layout, optimizer and the cost model its adapter declared."""
    return estimate(layout_of(plan, cost.shard_ranks), prof, cost, plan.cfg.optim.name, plan.cfg.optim.momentum,
                    device)


def predicted(plan, prof=None, per_node: int | None = None, device: str = "cpu") -> dict:
    """advise's memory estimate for this plan's busiest rank ({part: bytes, 'total', 'host'})."""
    prof = prof or profile(plan.cfg.model, plan.cfg.run.precision, device)
    cost = cost_of_plan(plan, prof, per_node)
    if cost is None:
        raise ValueError(f"{plan.cfg.framework.name} declares no cost model")
    return estimate_plan(plan, prof, cost, device)


def error(estimate_bytes: float, measured_bytes: float) -> float:
    """Signed relative error of the estimate: (estimate - measured) / measured."""
    if measured_bytes <= 0:
        raise ValueError("nothing measured")
    return (estimate_bytes - measured_bytes) / measured_bytes


def compare(record: dict, plan, prof=None) -> dict:
    """{'framework', 'layout', 'estimate', 'measured' (the busiest rank's tracker), 'error'}; the
    estimate compared leaves out the buffers the tracker cannot see (UNSEEN), saying so."""
    ranks = [r["tracker"] for r in record["memory"]["per_rank"] if r.get("tracker")]
    if not ranks:
        raise ValueError(f"{record.get('run_id')}: no memory.tracker (run with run.memory_tracker=true)")
    busiest = max(ranks, key=lambda t: t["peak_bytes"])
    prof = prof or profile(plan.cfg.model, plan.cfg.run.precision, busiest["device"].split(":")[0])
    cost = cost_of_plan(plan, prof)
    if cost is None:
        raise ValueError(f"{plan.cfg.framework.name} declares no cost model")
    unseen = {k: v for k, v in cost.buffers.items() if any(u in k for u in UNSEEN)}
    est = estimate_plan(plan, prof, cost, busiest["device"])
    on_device = est["total"] + (est["host"] if busiest["device"] == "cpu" else 0) - int(sum(unseen.values()))
    d = plan.dims
    return {"framework": plan.cfg.framework.name, "layout": f"dp{d.dp} tp{d.tp} pp{d.pp} mb{d.micro_batch}x{d.grad_accum}",
            "estimate": {**est, "compared": on_device, "unseen_by_tracker": unseen}, "measured": busiest,
            "error": error(on_device, busiest["peak_bytes"])}
