"""`bench advise`, phase 2: every candidate priced from its cost model and the calibration,
pruned by memory, ranked by predicted step time; the top ones marked to measure."""
from __future__ import annotations

from ddlbench.advise.calibrate import BASELINE
from ddlbench.advise.conclude import device_seconds
from ddlbench.advise.grid import Candidate
from ddlbench.advise.options import GiB
from ddlbench.advise.state import Advice
from ddlbench.errors import ConfigError
from ddlbench.estimate.memory import Layout, estimate


def attach_cost(c: Candidate, prof, per_node: int) -> None:
    """The candidate's cost model from its adapter (ddlbench.adapters.cost); a variant without one is
    pruned, saying so."""
    import dataclasses

    plan = c.plan
    try:
        cost = plan.variant.cost_model(plan.dims, prof, plan.cfg.run.precision, per_node)
    except ConfigError as exc:
        c.pruned = c.pruned or f"invalid: {exc}"
        return
    if cost is None:
        c.pruned = c.pruned or (f"no cost model: the {plan.variant.name} adapter declares none for these "
                                "options (bench advise cannot price it)")
        return
    c.cost = cost
    if cost.shard_ranks < c.layout.dp:
        c.layout = dataclasses.replace(c.layout, shard=cost.shard_ranks)


def candidate_row(c: Candidate, prof, cfg, device: str) -> dict:
    row = {"id": c.id, "label": c.label(), "framework": c.framework, "overrides": c.overrides, "pruned": c.pruned,
           "layout": c.layout.__dict__ if c.layout else None}
    if c.cost is not None:
        row["cost_model"] = c.cost.to_dict()
        row["memory_estimate"] = estimate(c.layout, prof, c.cost, cfg.optim.name, cfg.optim.momentum, device)
    return row


def rank_candidates(state: Advice, calibration: list[dict]) -> None:
    """Predict every surviving candidate, prune by memory, rank, mark the ones to measure."""
    from ddlbench.adapters.cost import CostModel, ModelProfile
    from ddlbench.estimate.step import comm_seconds, compute_at, predict
    from ddlbench.network.model import backend_algorithm, load
    from ddlbench.report.frame import training_memory_bytes

    prof = ModelProfile.from_dict(state.profile)
    network = load(state.network_source or state.network)
    opt = state.optimizer
    ddp, factor, overhead = {}, {}, {}
    cells = list(zip(state.calibration.cells, calibration))
    algorithm = state.options["algorithm"]
    if algorithm == "auto":     # what the backend of the device runs (gloo's flat rings on CPU)
        algorithm = backend_algorithm("gloo" if state.device == "cpu" else "nccl")
    for cell, r in cells:
        if r["status"] != "ok":
            continue
        step = float(r["timing"]["step_time_s"]["median"])
        if cell["framework"] == BASELINE:
            ddp[cell["micro_batch"]] = step
        elif cell.get("stands_in_for") == BASELINE:    # sharded: its step less its priced communication
            comm, _ = comm_seconds(CostModel.from_dict(cell["cost_model"]).traffic, network, algorithm)
            cell["comm_s"] = comm
            ddp[cell["micro_batch"]] = max(step - comm, 0.05 * step) / state.oversubscription
    if not ddp:
        reasons = ([f"{k}: {v}" for k, v in state.calibration.skipped.items()]
                   + [f"{c['framework']} mb{c['micro_batch']}: {r['status']}" for c, r in cells])
        raise ConfigError("no calibration run measured the compute of one device: " + "; ".join(reasons))
    for cell, r in cells:
        fw, m = cell["framework"], cell["micro_batch"]
        if r["status"] != "ok":
            key = f"{fw} over {cell['ranks']} ranks" if cell.get("own_collectives") else fw
            state.calibration.skipped[key] = f"{r['status']}: {(r.get('error') or {}).get('message')}"
            continue
        if cell.get("stands_in_for") or cell.get("own_collectives"):
            continue
        # the framework's own compute on one device, relative to DDP's at the same micro-batch
        factor[fw] = float(r["timing"]["step_time_s"]["median"]) / compute_at(m, ddp)
        # what its runtime adds beyond the estimate (allocator, libraries, engine buffers)
        measured = training_memory_bytes(r)
        if measured is not None and cell.get("cost_model"):
            est = estimate(Layout(fw, dp=1, micro_batch=m), prof, CostModel.from_dict(cell["cost_model"]),
                           opt["name"], opt["momentum"], state.device)["total"]
            overhead[fw] = min(overhead.get(fw, measured - est), measured - est)
    overhead = {fw: max(0, v) for fw, v in overhead.items()}
    comm_f = {}
    for cell, r in cells:
        fw = cell["framework"]
        if not cell.get("own_collectives") or r["status"] != "ok" or fw not in factor or not cell.get("cost_model"):
            continue
        priced, _ = comm_seconds(CostModel.from_dict(cell["cost_model"]).traffic, network, algorithm)
        compute = compute_at(cell["micro_batch"], ddp) * factor[fw] * state.oversubscription
        step = float(r["timing"]["step_time_s"]["median"])
        comm_f[fw] = comm_factor(step, compute, priced)
        cell.update(comm_measured_s=step - compute, comm_priced_s=priced)
    cal = state.calibration
    cal.comm_factor = comm_f
    cal.ddp_step_s, cal.compute_factor = {str(k): v for k, v in ddp.items()}, factor
    cal.runtime_overhead_bytes, cal.recompute = overhead, _recompute(state)
    limit = state.device_memory_bytes
    for c in state.candidates:
        if c["pruned"] or c.get("cost_model") is None:
            continue
        lay = Layout(**c["layout"])
        fw = c["framework"]
        c["memory_estimate"]["with_overhead"] = c["memory_estimate"]["total"] + overhead.get(fw, overhead.get(BASELINE, 0))
        if c["memory_estimate"]["with_overhead"] > limit:
            c["pruned"] = (f"memory: estimated {c['memory_estimate']['with_overhead'] / GiB:.2f} GiB > "
                           f"{limit / GiB:.2f} GiB per device")
            c["pruned_by_memory"] = True
        p = predict(lay, CostModel.from_dict(c["cost_model"]), ddp, network, state.calibration.recompute,
                    algorithm, compute_scale=state.oversubscription * factor.get(fw, 1.0),
                    comm_scale=comm_f.get(fw, 1.0))
        p["samples_per_s"] = state.options.get("global_batch") / p["step_s"] if p["step_s"] > 0 else None
        c["predicted"] = p
    ranked = sorted((c for c in state.candidates if c.get("predicted") and not c["pruned"]),
                    key=lambda c: c["predicted"]["step_s"])
    everything = state.options.get("evaluate") == "all"     # the exhaustive grid, to judge the advice by
    for i, c in enumerate(ranked, 1):
        c["rank"] = i
        c["measure"] = everything or i <= state.options["budget_runs"]
    over = sorted((c for c in state.candidates if c.get("pruned_by_memory")),
                  key=lambda c: c["memory_estimate"]["with_overhead"])
    for c in over if everything else over[:state.options["verify_pruned"]]:
        c["measure"] = c["verify_pruned"] = True
    state.calibration.device_s = sum(device_seconds(r) for _, r in cells)


def comm_factor(step_s: float, compute_s: float, priced_comm_s: float) -> float:
    """A framework's collectives measured against the network model's price of them: its step at
    the calibration's world less its compute there (its 1-rank step's factor over DDP's, x the
    oversubscription), over what the network model prices its traffic at; 1 where nothing is
    priced. Every byte of its traffic is then priced x this factor (one point: a per-step cost of
    its runtime, e.g. Horovod's negotiation cycle, scales with the bytes too; stated)."""
    if priced_comm_s <= 0:
        return 1.0
    return max(step_s - compute_s, 0.0) / priced_comm_s


def _recompute(state: Advice) -> float:
    """Hardware / model FLOPs with every block checkpointed (ddlbench/models/flops.py), if any candidate
    checkpoints; else 1."""
    if not any((c.get("layout") or {}).get("checkpointing") for c in state.candidates):
        return 1.0
    from ddlbench.models.flops import train_flops_per_sample
    from ddlbench.models.registry import build
    from ddlbench.planning.config import plan_from_overrides
    cfg = plan_from_overrides([f"model={state.options['model']}", *state.extra_overrides]).cfg
    f = train_flops_per_sample(build(cfg.model, state.device), recompute_blocks=True)
    return f["hardware_flops"] / f["flops"]
