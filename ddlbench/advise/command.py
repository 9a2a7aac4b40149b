"""`bench advise model=M devices=N [key=value ...]` and `bench advise resume DIR`.

Phases, each resumable (state in DIR/advice.json):
  1. grid + memory estimates; calibration (a sweep in DIR/calibration): 1-rank DDP runs at the
     grid's smallest and largest micro-batch, and (calibrate=frameworks, the default) one 1-rank
     run of every other framework: its compute factor over DDP and its runtime memory overhead;
  2. predictions from the calibration, memory pruning, ranking; the top `budget_runs` (and
     `verify_pruned` of the memory-pruned) measured as a sweep in DIR/measure;
  3. collect: predicted vs measured step time, estimated vs measured memory, rank correlation.
With backend=local the three run in one call; with backend=slurm each sweep is a job array and
`bench advise resume DIR` continues once it has finished.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from ddlbench import rundir
from ddlbench.advise.grid import DEFAULT_FRAMEWORKS, Candidate, enumerate_grid
from ddlbench.advise.memory import Layout, estimate
from ddlbench.errors import ConfigError
from ddlbench.results import atomic_write_json

ADVICE = "advice.json"
GiB = 1 << 30
PASS_THROUGH = ("run.", "optim.", "data.", "model.")    # config overrides given to every run
KEYS = {"model", "devices", "global_batch", "micro_batches", "device_memory_gib", "network", "frameworks",
        "budget_runs", "backend", "dir", "verify_pruned", "devices_per_node", "algorithm", "calibrate", "evaluate",
        "repeats"}
USAGE = ("usage: bench advise model=PRESET devices=N [global_batch=G] [micro_batches=[1,2,...]] "
         "[device_memory_gib=X] [network=NAME] [frameworks=a,b,...] [budget_runs=K] [backend=local|slurm] "
         "[verify_pruned=K] [devices_per_node=N] [calibrate=frameworks|ddp] [evaluate=none|all] [repeats=R] [dir=DIR] [run.KEY=VALUE logger=... ...]   |   bench advise resume DIR")


# ---- arguments ---------------------------------------------------------------------------------
def parse(args: list[str]) -> tuple[dict, list[str]]:
    """(options, run.* overrides passed to every run)."""
    opts, extra = {}, []
    for a in args:
        if "=" not in a:
            raise ConfigError(f"bench advise: '{a}' is not key=value\n{USAGE}")
        k, v = a.split("=", 1)
        if k.startswith(PASS_THROUGH) or k in ("logger", "optim", "data", "experiment"):
            extra.append(a)
        elif k in KEYS:
            opts[k] = v
        else:
            raise ConfigError(f"bench advise: unknown option '{k}' (known: {', '.join(sorted(KEYS))}; "
                              "overrides for every run: run.*, optim.*, data.*, model.*, logger, optim, data, experiment)")
    for k in ("model", "devices"):
        if k not in opts:
            raise ConfigError(f"bench advise: {k}= is required\n{USAGE}")
    out = {"model": opts["model"], "devices": _int(opts, "devices"),
           "global_batch": _int(opts, "global_batch", None), "budget_runs": _int(opts, "budget_runs", 3, low=0),
           "verify_pruned": _int(opts, "verify_pruned", 0, low=0), "repeats": _int(opts, "repeats", 3),
           "devices_per_node": _int(opts, "devices_per_node", None),
           "micro_batches": [int(x) for x in opts["micro_batches"].strip("[]").split(",")] if "micro_batches" in opts else None,
           "device_memory_gib": float(opts["device_memory_gib"]) if "device_memory_gib" in opts else None,
           "network": opts.get("network", "auto"), "backend": opts.get("backend", "local"),
           "frameworks": opts["frameworks"].split(",") if "frameworks" in opts else list(DEFAULT_FRAMEWORKS),
           "dir": opts.get("dir"), "algorithm": opts.get("algorithm", "auto"),
           "calibrate": opts.get("calibrate", "frameworks"), "evaluate": opts.get("evaluate", "none")}
    from ddlbench.config import group_options
    unknown = [f for f in out["frameworks"] if f not in group_options("framework")]
    if unknown:       # any conf/framework variant is priced by its adapter's cost model
        raise ConfigError(f"bench advise: no framework config {', '.join(unknown)} "
                          f"(conf/framework has: {', '.join(group_options('framework'))})")
    if out["calibrate"] not in ("ddp", "frameworks"):
        raise ConfigError(f"calibrate must be ddp or frameworks, got {out['calibrate']!r}")
    if out["evaluate"] not in ("none", "all"):
        raise ConfigError(f"evaluate must be none or all (measure every candidate and judge the advice by its "
                          f"regret), got {out['evaluate']!r}")
    if out["backend"] not in ("local", "slurm"):
        raise ConfigError(f"backend must be local or slurm, got {out['backend']!r}")
    return out, extra


def _int(opts: dict, key: str, default=0, low: int = 1):
    if key not in opts:
        return default
    try:
        v = int(opts[key])
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {opts[key]!r}") from None
    if v < low:
        raise ConfigError(f"{key} must be >= {low}, got {v}")
    return v


# ---- phase 1 -------------------------------------------------------------------------------------
DEFAULT_NETWORK = {"cpu": "local_gloo", "cuda": "dgx_h100"}


def default_network(device: str, environ=os.environ) -> str:
    """network=auto: inside `bench cluster`, the cluster's own description ($DDLBENCH_NETWORK);
    else gloo between processes of this machine on CPU (calibrated here); on GPUs a reference
    H100 NVLink + InfiniBand cluster (conf/network/dgx_h100.yaml) - never the CPU's gloo figures,
    ~100x too slow for NCCL. Measure yours with `bench commbench` (its network.yaml)."""
    return environ.get("DDLBENCH_NETWORK") or DEFAULT_NETWORK[device]


def devices_per_node(given: int | None, device: str, visible_gpus: int, network) -> tuple[int, str]:
    """(devices per node, where it came from): devices_per_node=, else on GPUs the GPUs visible
    on this node, else the network's first dimension."""
    if given:
        return given, "devices_per_node"
    if device == "cuda" and visible_gpus > 0:
        return visible_gpus, "GPUs visible on this node"
    return network.dims[0].size, f"network {network.name}"


def device_memory_bytes(opts: dict, device: str) -> tuple[int, str]:
    """The memory one device offers: device_memory_gib, else the GPU's, else (CPU) the host's
    memory divided by the devices sharing it."""
    if opts["device_memory_gib"] is not None:
        return int(opts["device_memory_gib"] * GiB), "device_memory_gib"
    if device == "cuda":     # NVML, not CUDA: the calibration and measurement cells are forked from here
        from ddlbench.gpus import visible_gpus
        info = visible_gpus()
        return info.min_memory, f"the smallest visible GPU ({info.source})"
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    return total // opts["devices"], f"host MemTotal / {opts['devices']} devices"


def spread_overrides(devices: int, per_node: int, backend: str) -> list[str]:
    """What a measured candidate adds to run on the nodes its devices fill: with backend=slurm and
    more devices than a node has (inside `bench cluster`: one core per node), one Slurm task per
    rank over ceil(devices / per_node) nodes (the sweep's Slurm back end sizes the job from them);
    on one node nothing (the local launcher)."""
    nodes = math.ceil(devices / per_node)
    return ["launcher=slurm", f"launcher.nodes={nodes}"] if backend == "slurm" and nodes > 1 else []


def calibration_overrides(framework: str, model: str, micro_batch: int, extra: list[str],
                          threads: int | None, ranks: int = 1) -> list[str]:
    """One rank (or `ranks`: the sharded calibration), no accumulation; on CPU with the threads
    each candidate's rank gets (the cores divided among the devices), so its compute is a
    device's compute."""
    return [f"framework={framework}", f"model={model}", f"launcher.nproc={ranks}",
            f"run.global_batch={micro_batch * ranks}",
            *([f"launcher.threads_per_rank={threads}"] if threads else []), *extra]


SHARDED_CALIBRATION = "fsdp_full"


def calibration_plan(cell: dict, opts: dict, extra: list[str], threads: int | None, prof, per_node: int,
                     limit: int, device: str):
    """(overrides, plan, cost) of a calibration cell that fits one device by the estimate. A 1-rank
    DDP cell that does not fit (a model too big for one device: where sharding advice matters
    most) becomes FSDP2 full shard over every device, whose compute is the step it measures less
    the communication the network model prices (rank_candidates); any other 1-rank cell that does
    not fit is skipped. Raises ConfigError with the reason."""
    from ddlbench.advise.memcheck import cost_of_plan, estimate_plan
    from ddlbench.config import plan_from_overrides

    for ranks in ([1, opts["devices"]] if cell["framework"] == "ddp" and opts["devices"] > 1 else [1]):
        fw = cell["framework"] if ranks == 1 else SHARDED_CALIBRATION
        over = calibration_overrides(fw, opts["model"], cell["micro_batch"], extra, threads, ranks)
        plan = plan_from_overrides(over)
        cost = cost_of_plan(plan, prof, per_node)
        if cost is None:
            return over, plan, cost
        est = estimate_plan(plan, prof, cost, device)["total"]
        if est <= limit:
            if ranks > 1:
                cell.update(framework=fw, ranks=ranks, stands_in_for="ddp")
            return over, plan, cost
    raise ConfigError(f"does not fit one device: estimated {est / GiB:.2f} GiB > {limit / GiB:.2f} GiB"
                      + (f", and {SHARDED_CALIBRATION} over {opts['devices']} devices neither" if ranks > 1 else ""))


def calibration_cells(survivors: list[Candidate], calibrate: str) -> list[dict]:
    """DDP at the smallest and largest micro-batch (the compute line); with calibrate=frameworks
    also every other framework at 1 rank at its largest micro-batch (its own overhead on one
    device: hooks, DTensor, engine, library memory)."""
    mbs = sorted({c.layout.micro_batch for c in survivors}) or [1]
    cells = [{"framework": "ddp", "micro_batch": m} for m in sorted({mbs[0], mbs[-1]})]
    if calibrate == "frameworks":
        for fw in dict.fromkeys(c.framework for c in survivors):
            if fw != "ddp":
                cells.append({"framework": fw, "micro_batch": max(c.layout.micro_batch for c in survivors
                                                                  if c.framework == fw)})
    return cells


def start(args: list[str]) -> int:
    from ddlbench.advise.profile import profile
    from ddlbench.config import compose_raw
    from ddlbench.device import launcher_device
    from ddlbench.gpus import visible_gpus
    from ddlbench.network.model import load

    opts, extra = parse(args)
    run_cfg = compose_raw([f"model={opts['model']}", *extra])["run"]
    device = launcher_device(run_cfg.get("device", "auto"))
    if opts["network"] == "auto":
        opts["network"] = default_network(device)
    network = load(opts["network"])
    if opts["devices"] > network.max_devices:
        raise ConfigError(f"devices={opts['devices']} exceed network {network.name} ({network.max_devices} devices)")
    per_node, per_node_source = devices_per_node(opts["devices_per_node"], device,
                                                 visible_gpus().count if device == "cuda" else 0, network)
    out = Path(opts["dir"] or rundir.advise_root(opts["model"], opts["devices"]))
    if (out / ADVICE).exists():
        raise ConfigError(f"{out} already holds an {ADVICE}; continue it with `bench advise resume {out}`")
    if opts["global_batch"] is None:
        opts["global_batch"] = run_cfg["global_batch"]
    print(f"advise: {opts['model']} on {opts['devices']} {device} devices, global batch {opts['global_batch']} "
          f"(every candidate), network {network.name} ({network.description}), {per_node} devices per node "
          f"({per_node_source})", flush=True)
    grid = enumerate_grid(opts["model"], opts["devices"], opts["global_batch"], opts["frameworks"],
                          opts["micro_batches"], per_node, tuple(extra))
    valid = [c for c in grid if c.plan is not None]
    if not valid:
        raise ConfigError("no candidate is valid: " + "; ".join(f"{c.label()}: {c.pruned}" for c in grid[:5]))
    cfg = valid[0].plan.cfg
    prof = profile(cfg.model, cfg.run.precision)
    for c in valid:
        attach_cost(c, prof, per_node)
    across = spread_overrides(opts["devices"], per_node, opts["backend"])
    for c in grid:
        c.overrides = [*c.overrides, *across]
    limit, limit_source = device_memory_bytes(opts, device)
    survivors = [c for c in grid if not c.pruned]
    state = {"phase": "calibrate", "options": opts, "extra_overrides": extra, "network": network.name,
             "network_source": str(network.source),         # a file given as network= has no conf name
             "devices_per_node": per_node, "device": device, "precision": cfg.run.precision,
             "device_memory_bytes": limit, "device_memory_source": limit_source,
             "optimizer": {"name": cfg.optim.name, "momentum": cfg.optim.momentum},
             "profile": prof.to_dict(), "calibration": {"cells": [], "skipped": {}},
             "candidates": [_candidate_row(c, prof, cfg, device) for c in grid]}
    threads = None
    if device == "cpu":
        from ddlbench.envinfo import usable_cores
        from ddlbench.launch.local import threads_per_rank
        threads = threads_per_rank(valid[0].plan)
        # ranks x threads over the cores of a node (a node of `bench cluster` has its own), against the
        # 1-rank calibration's
        state["oversubscription"] = (max(1.0, min(opts["devices"], per_node) * threads / usable_cores())
                                     / max(1.0, threads / usable_cores()))
    overrides, raws = [], []
    for cell in calibration_cells(survivors, opts["calibrate"]):
        try:
            over, plan, cost = calibration_plan(cell, opts, extra, threads, prof, per_node, limit, device)
        except ConfigError as exc:     # this framework cannot run on one rank: DDP's compute stands in
            state["calibration"]["skipped"][cell["framework"]] = str(exc)
            continue
        raws.append(plan.raw)
        cell["cost_model"] = cost.to_dict() if cost is not None else None
        state["calibration"]["cells"].append(cell)
        overrides.append(over)
    if not state["calibration"]["cells"]:
        raise ConfigError("no calibration run can measure one device's compute: "
                          + "; ".join(f"{k}: {v}" for k, v in state["calibration"]["skipped"].items()))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / ADVICE, state)
    pruned = sum(1 for c in grid if c.pruned)
    print(f"grid: {len(grid)} candidates, {pruned} pruned by validation; calibration: "
          + ", ".join(f"{c['framework']} mb{c['micro_batch']}"
                      + (f" over {c['ranks']} ranks (DDP does not fit one device)" if c.get("ranks", 1) > 1 else "")
                      for c in state["calibration"]["cells"])
          + " (1 rank unless said)", flush=True)
    _sweep(out / "calibration", overrides, opts["backend"], raws)
    return resume(out)


def attach_cost(c: Candidate, prof, per_node: int) -> None:
    """The candidate's cost model from its adapter (ddlbench.adapters.cost); a variant without one is
    pruned, saying so."""
    import dataclasses

    plan = c.plan
    try:
        cost = plan.adapter_cls.cost_model(plan.options, plan.dims, prof, plan.cfg.run.precision, per_node)
    except ConfigError as exc:
        c.pruned = c.pruned or f"invalid: {exc}"
        return
    if cost is None:
        c.pruned = c.pruned or (f"no cost model: the {plan.adapter_cls.name} adapter declares none for these "
                                "options (bench advise cannot price it)")
        return
    c.cost = cost
    if cost.shard_ranks < c.layout.dp:
        c.layout = dataclasses.replace(c.layout, shard=cost.shard_ranks)


def _candidate_row(c: Candidate, prof, cfg, device: str) -> dict:
    row = {"id": c.id, "label": c.label(), "framework": c.framework, "overrides": c.overrides, "pruned": c.pruned,
           "layout": c.layout.__dict__ if c.layout else None}
    if c.cost is not None:
        row["cost_model"] = c.cost.to_dict()
        row["memory_estimate"] = estimate(c.layout, prof, c.cost, cfg.optim.name, cfg.optim.momentum, device)
    return row


def _sweep(sweep_dir: Path, overrides: list[list[str]], backend: str, raws: list[dict] | None = None) -> None:
    """`overrides` as a sweep; `raws`: their composed configs where the caller already has them."""
    from ddlbench.config import plan_from_overrides
    from ddlbench.sweep.cells import Cell, cell_id
    from ddlbench.sweep.commands import start_cells

    raws = raws or [plan_from_overrides(o).raw for o in overrides]
    cells = [Cell(index=i, id=cell_id(raw), overrides=o, repeat=0) for i, (o, raw) in enumerate(zip(overrides, raws))]
    start_cells(sweep_dir, cells, {"overrides": ["(bench advise)"], "repeats": 1}, backend,
                job_name="ddlbench-advise")


def _results(sweep_dir: Path) -> list[dict | None]:
    from ddlbench.sweep import manifest
    return [manifest.cell_result(sweep_dir, c) for c in manifest.read(sweep_dir)]


# ---- phases 2 and 3 ------------------------------------------------------------------------------
def resume(out: Path) -> int:
    path = Path(out) / ADVICE
    if not path.is_file():
        raise ConfigError(f"{out}: not an advise directory (no {ADVICE})")
    state = json.loads(path.read_text())
    if state["phase"] == "calibrate":
        results = _finished(Path(out), "calibration", state["options"]["backend"])
        if results is None:
            return 1 if state["options"]["backend"] == "local" else 0
        for cell, r in zip(state["calibration"]["cells"], results):
            if r["status"] != "ok" and cell["framework"] == "ddp":
                raise ConfigError(f"the DDP calibration run failed ({r['status']}): {r['error']}")
        rank_candidates(state, results)
        chosen = [c for c in state["candidates"] if c.get("measure")]
        state["phase"] = "measure" if chosen else "done"
        state["rounds"] = [_first_round(state)] if chosen else []
        atomic_write_json(path, state)
        _print_ranking(state)
        if chosen:
            _sweep(out / "measure", [c["overrides"] for c in chosen], state["options"]["backend"])
    while state["phase"] == "measure":
        rounds = state.setdefault("rounds", [_first_round(state)])      # a state written before rounds
        last = rounds[-1]
        if not last.get("folded"):
            results = _finished(Path(out), last["dir"], state["options"]["backend"])
            if results is None:
                return 1 if state["options"]["backend"] == "local" else 0
            fold(state, [cid for cid, _ in last["cells"]], results)
            last["folded"] = True
        cells, why = next_round(state)
        if cells:
            rounds.append({"dir": f"measure-{len(rounds) + 1}", "cells": cells, "why": why})
            atomic_write_json(path, state)
            by_id = {c["id"]: c for c in state["candidates"]}
            print(f"advise: measuring ({why}): " + ", ".join(f"{by_id[i]['label']} (run {n + 1})" for i, n in cells),
                  flush=True)
            _sweep(out / rounds[-1]["dir"], [by_id[i]["overrides"] + ([f"run.repeat={n}"] if n else []) for i, n in cells],
                   state["options"]["backend"])
            continue
        collect(state)
        state["phase"] = "done"
        atomic_write_json(path, state)
    _print_result(state, out)
    return 0


def _first_round(state: dict) -> dict:
    return {"dir": "measure", "cells": [[c["id"], 0] for c in state["candidates"] if c.get("measure")], "why": "first"}


def _finished(out: Path, phase: str, backend: str) -> list[dict] | None:
    """The results of a phase's sweep, or None (and how to go on) while cells have none. On the
    local back end the sweep has already run: a cell without a result crashed before writing one."""
    results = _results(out / phase)
    if any(r is None for r in results):
        if backend == "local":
            print(f"bench advise: {sum(r is None for r in results)} {phase} cell(s) ended without a result; see "
                  f"`bench sweep status {out / phase}`; after fixing, `bench sweep resume {out / phase}`, then "
                  f"`bench advise resume {out}`", file=sys.stderr)
        else:
            print(f"{phase} not finished; follow with `bench sweep status {out / phase}`, then `bench advise resume {out}`")
        return None
    return results


def rank_candidates(state: dict, calibration: list[dict]) -> None:
    """Predict every surviving candidate, prune by memory, rank, mark the ones to measure."""
    from ddlbench.adapters.cost import CostModel, ModelProfile
    from ddlbench.advise.predict import comm_seconds, compute_at, predict
    from ddlbench.network.model import backend_algorithm, load
    from ddlbench.report.frame import training_memory_bytes

    prof = ModelProfile.from_dict(state["profile"])
    network = load(state.get("network_source") or state["network"])
    opt = state["optimizer"]
    ddp, factor, overhead = {}, {}, {}
    cells = list(zip(state["calibration"]["cells"], calibration))
    algorithm = state["options"]["algorithm"]
    if algorithm == "auto":     # what the backend of the device runs (gloo's flat rings on CPU)
        algorithm = backend_algorithm("gloo" if state["device"] == "cpu" else "nccl")
    for cell, r in cells:
        if r["status"] != "ok":
            continue
        step = float(r["timing"]["step_time_s"]["median"])
        if cell["framework"] == "ddp":
            ddp[cell["micro_batch"]] = step
        elif cell.get("stands_in_for") == "ddp":    # sharded: its step less its priced communication
            comm, _ = comm_seconds(CostModel.from_dict(cell["cost_model"]).traffic, network, algorithm)
            cell["comm_s"] = comm
            ddp[cell["micro_batch"]] = max(step - comm, 0.05 * step) / state.get("oversubscription", 1.0)
    if not ddp:
        reasons = ([f"{k}: {v}" for k, v in state["calibration"]["skipped"].items()]
                   + [f"{c['framework']} mb{c['micro_batch']}: {r['status']}" for c, r in cells])
        raise ConfigError("no calibration run measured the compute of one device: " + "; ".join(reasons))
    for cell, r in cells:
        fw, m = cell["framework"], cell["micro_batch"]
        if r["status"] != "ok":
            state["calibration"]["skipped"][fw] = f"{r['status']}: {(r.get('error') or {}).get('message')}"
            continue
        if cell.get("stands_in_for"):
            continue
        # the framework's own compute on one device, relative to DDP's at the same micro-batch
        factor[fw] = float(r["timing"]["step_time_s"]["median"]) / compute_at(m, ddp)
        # what its runtime adds beyond the estimate (allocator, libraries, engine buffers)
        measured = training_memory_bytes(r)
        if measured is not None and cell.get("cost_model"):
            est = estimate(Layout(fw, dp=1, micro_batch=m), prof, CostModel.from_dict(cell["cost_model"]),
                           opt["name"], opt["momentum"], state["device"])["total"]
            overhead[fw] = min(overhead.get(fw, measured - est), measured - est)
    overhead = {fw: max(0, v) for fw, v in overhead.items()}
    state["calibration"].update({"ddp_step_s": {str(k): v for k, v in ddp.items()}, "compute_factor": factor,
                                 "runtime_overhead_bytes": overhead, "recompute": _recompute(state)})
    limit = state["device_memory_bytes"]
    for c in state["candidates"]:
        if c["pruned"] or c.get("cost_model") is None:
            continue
        lay = Layout(**c["layout"])
        fw = c["framework"]
        c["memory_estimate"]["with_overhead"] = c["memory_estimate"]["total"] + overhead.get(fw, overhead.get("ddp", 0))
        if c["memory_estimate"]["with_overhead"] > limit:
            c["pruned"] = (f"memory: estimated {c['memory_estimate']['with_overhead'] / GiB:.2f} GiB > "
                           f"{limit / GiB:.2f} GiB per device")
            c["pruned_by_memory"] = True
        p = predict(lay, CostModel.from_dict(c["cost_model"]), ddp, network, state["calibration"]["recompute"],
                    algorithm, compute_scale=state.get("oversubscription", 1.0) * factor.get(fw, 1.0))
        p["samples_per_s"] = state["options"].get("global_batch") / p["step_s"] if p["step_s"] > 0 else None
        c["predicted"] = p
    ranked = sorted((c for c in state["candidates"] if c.get("predicted") and not c["pruned"]),
                    key=lambda c: c["predicted"]["step_s"])
    everything = state["options"].get("evaluate") == "all"     # the exhaustive grid, to judge the advice by
    for i, c in enumerate(ranked, 1):
        c["rank"] = i
        c["measure"] = everything or i <= state["options"]["budget_runs"]
    over = sorted((c for c in state["candidates"] if c.get("pruned_by_memory")),
                  key=lambda c: c["memory_estimate"]["with_overhead"])
    for c in over if everything else over[:state["options"]["verify_pruned"]]:
        c["measure"] = c["verify_pruned"] = True
    state["calibration"]["device_s"] = sum(device_seconds(r) for _, r in cells)


def device_seconds(r: dict) -> float:
    """What a run cost: its ranks x (start-up to the first step + the timed window's wall time);
    probes and teardown are left out (the same for every candidate)."""
    start = (r.get("startup_s") or {}).get("total_to_first_step") or 0.0
    wall = (r.get("timing") or {}).get("wall_s") or 0.0
    return ((r.get("parallel") or {}).get("world_size") or 1) * (start + wall)


def _recompute(state: dict) -> float:
    """Hardware / model FLOPs with every block checkpointed (ddlbench/models/flops.py), if any candidate
    checkpoints; else 1."""
    if not any((c.get("layout") or {}).get("checkpointing") for c in state["candidates"]):
        return 1.0
    from ddlbench.config import plan_from_overrides
    from ddlbench.models.flops import train_flops_per_sample
    from ddlbench.models.registry import build
    cfg = plan_from_overrides([f"model={state['options']['model']}", *state["extra_overrides"]]).cfg
    f = train_flops_per_sample(build(cfg.model, state["device"]), recompute_blocks=True)
    return f["hardware_flops"] / f["flops"]


def _run_row(r: dict) -> dict:
    from ddlbench.report.frame import training_memory_bytes
    row = {"status": r["status"], "run_id": r.get("run_id"), "device_s": device_seconds(r),
           "error": (r.get("error") or {}).get("message") if r["status"] != "ok" else None}
    if r["status"] == "ok":
        row.update({"step_s": float(r["timing"]["step_time_s"]["median"]),
                    "samples_per_s": r["throughput"].get("samples_per_s"), "memory_bytes": training_memory_bytes(r),
                    "time_to_target_s": (r.get("convergence") or {}).get("time_to_target_s")})
    return row


def fold(state: dict, ids: list[str], results: list[dict]) -> None:
    """One round's results, in the order of its cells, as runs of their candidates."""
    by_id = {c["id"]: c for c in state["candidates"]}
    for cid, r in zip(ids, results):
        by_id[cid].setdefault("runs", []).append(_run_row(r))


def _ranked(state: dict) -> list[dict]:
    return sorted((c for c in state["candidates"] if c.get("rank") and not c.get("pruned")), key=lambda c: c["rank"])


def _key(state: dict) -> str:
    """With experiment= (a quality target) the first to reach the target wins; else the fastest step."""
    from ddlbench.advise.rounds import value
    ok = [c for c in state["candidates"] if value(c, "step_s") is not None and not c.get("verify_pruned")]
    return "time_to_target_s" if ok and all(value(c, "time_to_target_s") is not None for c in ok) else "step_s"


def next_round(state: dict) -> tuple[list[list], str]:
    """([candidate id, repeat index] to measure next, why): failed candidates of the budget
    replaced, the two best repeated until their order is clear (ddlbench.advise.rounds)."""
    from ddlbench.advise.rounds import decide
    d = decide(_ranked(state), _budget(state), _key(state), state["options"].get("repeats", 1))
    state["decision"] = d
    by_id = {c["id"]: c for c in state["candidates"]}
    if d["measure"]:
        return [[i, 0] for i in d["measure"]], "in place of failed candidates"
    if d["repeat"]:
        return [[i, len(by_id[i]["runs"])] for i in d["repeat"]], "again: the margin between the two best is within their noise"
    return [], ""


def _measured(c: dict) -> dict:
    """A candidate's runs in one row: medians of its successful runs, the last failure if none."""
    from ddlbench.advise.rounds import value
    runs = c["runs"]
    ok = [r for r in runs if r["status"] == "ok"]
    m = dict(ok[0] if ok else runs[-1])
    if ok:
        ttt = [r["time_to_target_s"] for r in ok]
        m.update({"step_s": value(c, "step_s"), "samples_per_s": value(c, "samples_per_s"),
                  "time_to_target_s": value(c, "time_to_target_s") if None not in ttt else None,
                  "memory_bytes": max((r["memory_bytes"] for r in ok if r["memory_bytes"]), default=None),
                  "step_s_runs": [r["step_s"] for r in ok]})
    m.update({"runs": len(runs), "device_s": sum(r["device_s"] for r in runs)})
    return m


def collect(state: dict) -> None:
    from ddlbench.metrics.stats import spearman

    chosen = [c for c in state["candidates"] if c.get("runs")]
    for c in chosen:
        m = _measured(c)
        if m["status"] == "ok":
            if m["memory_bytes"]:
                est = c["memory_estimate"]["with_overhead"]
                m["memory_error"] = (est - m["memory_bytes"]) / m["memory_bytes"]
            m["step_error"] = (c["predicted"]["step_s"] - m["step_s"]) / m["step_s"]
        c["measured"] = m
    ok = [c for c in chosen if c["measured"]["status"] == "ok" and c.get("predicted") and not c.get("verify_pruned")]
    state["rank_correlation"] = spearman([c["predicted"]["step_s"] for c in ok], [c["measured"]["step_s"] for c in ok])
    by = {}
    for c in chosen:
        e = (c.get("measured") or {}).get("memory_error")
        if e is not None:
            by.setdefault(c["framework"], []).append(e)
    state["memory_error_by_framework"] = by
    key = _key(state)
    state["recommendation"] = recommendation(state, key)
    if state.get("options", {}).get("evaluate") == "all":
        state["evaluation"] = evaluation(state, key)


def recommendation(state: dict, key: str) -> dict | None:
    """The best the advice measured (its budget, failed candidates replaced), with its margin over
    the runner-up and their run-to-run spread; a tie lists every candidate within that spread."""
    from ddlbench.advise.rounds import decide
    d = decide(_ranked(state), _budget(state), key, state.get("options", {}).get("repeats", 1))
    by_id = {c["id"]: c for c in state["candidates"]}
    best = by_id.get(d["best"])
    if best is None:
        return None
    m = best["measured"]
    return {"id": best["id"], "label": best["label"], "overrides": best["overrides"], "by": key,
            "measured_step_s": m["step_s"], "time_to_target_s": m["time_to_target_s"], "samples_per_s": m["samples_per_s"],
            "runs": m["runs"], "runner_up": by_id[d["runner_up"]]["label"] if d["runner_up"] else None,
            "margin": d["margin"], "spread": d["spread"], "settled": d["settled"],
            "tie": [by_id[i]["label"] for i in d["tie"]] if d["tie"] else None,
            "advice": [c["label"] for c in _advice(state)]}


def _advice(state: dict) -> list[dict]:
    from ddlbench.advise.rounds import advice_set
    return advice_set(_ranked(state), _budget(state))


def _budget(state: dict) -> int:
    """The advice's budget of measured candidates (a state without options: all of them)."""
    return state.get("options", {}).get("budget_runs", len(state["candidates"]))


def evaluation(state: dict, key: str) -> dict:
    """evaluate=all: the advice (its top budget_runs by prediction) against every candidate
    measured (ddlbench.advise.regret), and what finding it cost against measuring the grid."""
    from ddlbench.advise.regret import evaluate
    ranked = sorted((c for c in state["candidates"] if c.get("rank") and c.get("measured")), key=lambda c: c["rank"])
    if not any(c["measured"]["status"] == "ok" for c in ranked):
        return {"error": "no candidate ran"}
    budget = state["options"]["budget_runs"]
    measured = [c["measured"][key] if c["measured"]["status"] == "ok" else math.inf for c in ranked]
    out = evaluate([c["predicted"]["step_s"] for c in ranked], measured, budget=budget or None)
    out["regret"] = {k: (v if math.isfinite(v) else None) for k, v in out["regret"].items()}   # None: all of the top k failed
    advice = _advice(state)
    # the advice: calibration, its budget (failed ones replaced) with their repeats; the grid: one run each
    advice_s = state["calibration"].get("device_s", 0.0) + sum(c["measured"]["device_s"] for c in advice)
    grid_s = sum(c["runs"][0]["device_s"] for c in ranked)
    out.update({"by": key, "best": next(c["label"] for c, m in zip(ranked, measured) if m == out["best_measured"]),
                "advice": [c["label"] for c in advice],
                "cost": {"advice_device_s": advice_s, "grid_device_s": grid_s,
                         "advice_over_grid": advice_s / grid_s if grid_s else None,
                         "budget_fraction": budget / len(ranked)}})
    rec = state["recommendation"]
    chosen = (rec["measured_step_s"] if key == "step_s" else rec["time_to_target_s"]) if rec else None
    out["regret_of_recommendation"] = chosen / out["best_measured"] if chosen else None
    return out


# ---- output --------------------------------------------------------------------------------------
def _fmt(x, scale=1.0, f=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x * scale, f)


def table(state: dict, limit: int = 15) -> str:
    rows = [("rank", "candidate", "pred ms", "meas ms", "est MiB", "meas MiB", "status / why pruned")]
    ranked = sorted((c for c in state["candidates"] if c.get("rank")), key=lambda c: c["rank"])
    for c in ranked[:limit]:
        m = c.get("measured") or {}
        rows.append((str(c["rank"]), c["label"], _fmt(c["predicted"]["step_s"], 1e3),
                     _fmt(m.get("step_s"), 1e3), _fmt(c["memory_estimate"]["with_overhead"], 1 / 2**20, ".0f"),
                     _fmt(m.get("memory_bytes"), 1 / 2**20, ".0f"), m.get("status", "predicted")))
    for c in state["candidates"]:
        if c["pruned"]:
            m = c.get("measured") or {}
            rows.append(("-", c["label"], _fmt((c.get("predicted") or {}).get("step_s"), 1e3),
                         _fmt(m.get("step_s"), 1e3),
                         _fmt((c.get("memory_estimate") or {}).get("with_overhead"), 1 / 2**20, ".0f"),
                         _fmt(m.get("memory_bytes"), 1 / 2**20, ".0f"), c["pruned"][:90]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def _print_ranking(state: dict) -> None:
    n = sum(1 for c in state["candidates"] if c.get("rank"))
    k = sum(1 for c in state["candidates"] if c.get("measure"))
    print(f"ranked {n} candidates by predicted step time; measuring {k}", flush=True)


def _print_result(state: dict, out: Path) -> None:
    print(table(state))
    rc = state.get("rank_correlation")
    print(f"rank correlation (Spearman, predicted vs measured step time, {sum(1 for c in state['candidates'] if (c.get('measured') or {}).get('status') == 'ok')} runs): "
          f"{_fmt(rc, 1, '.2f')}")
    for fw, errs in sorted((state.get("memory_error_by_framework") or {}).items()):
        print(f"memory estimate error {fw}: " + ", ".join(f"{e:+.0%}" for e in errs))
    ev = state.get("evaluation")
    if ev and "regret" in ev:
        print(_evaluation_text(ev))
    rec = state.get("recommendation")
    if rec:
        why = (f"reached the target first: {rec['time_to_target_s']:.2f} s" if rec.get("by") == "time_to_target_s"
               else "the fastest step")
        runs = rec.get("runs") or 1
        print(f"recommendation: {rec['label']} ({rec['samples_per_s']:.1f} samples/s measured"
              f"{f', median of {runs} runs' if runs > 1 else ''}; {why})\n  {margin_text(rec)}\n"
              f"  bench run {' '.join(rec['overrides'])}")
    print(f"advice: {out / ADVICE}   report: bench report {out}")


def margin_text(rec: dict) -> str:
    """How sure the recommendation is: its margin over the runner-up against their noise."""
    if rec.get("runner_up") is None:
        return "the only candidate of the advice that ran"
    margin = f"{rec['margin']:.1%} ahead of {rec['runner_up']}"
    if rec.get("tie"):
        return (f"tie: {', '.join(rec['tie'])} are within the run-to-run spread ({rec['spread']:.1%}) of the "
                f"fastest after {rec['runs']} runs of the two best; any of them")
    if rec.get("spread") is None:
        return f"{margin}; run-to-run noise not measured (repeats=1)"
    return f"{margin}, beyond the run-to-run spread of both ({rec['spread']:.1%})"


def _evaluation_text(ev: dict) -> str:
    regrets = ", ".join(f"@{k} {_fmt(v, 1, '.3f')}" for k, v in ev["regret"].items())
    tau, ci = ev["kendall_tau_b"], ev["kendall_tau_b_interval"]
    cost = ev["cost"]
    lines = [f"evaluation ({ev['candidates']} candidates measured, {ev['feasible']} ran; true best {ev['best']}, by {ev['by']}):",
             f"  regret {regrets}; true best in the top: " + ", ".join(f"@{k} {'yes' if v else 'no'}"
                                                                       for k, v in ev["best_in_top"].items()),
             f"  the recommendation (failed candidates replaced, the two best repeated): regret "
             f"{_fmt(ev.get('regret_of_recommendation'), 1, '.3f')}",
             "  infeasible in the top: " + ", ".join(f"@{k} {v}" for k, v in ev["infeasible_in_top"].items()),
             f"  Kendall tau-b {_fmt(tau, 1, '.2f')}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
             f"  spread (slowest / fastest) {ev['spread']:.2f}" + (" - every candidate within 5%: low regret is trivial here"
                                                                    if ev["trivial"] else ""),
             f"  cost to find: {cost['advice_device_s']:.0f} device-s (calibration + budget) vs {cost['grid_device_s']:.0f} "
             f"for the grid ({_fmt(cost['advice_over_grid'], 100, '.0f')}%; budget {cost['budget_fraction']:.0%} of the grid)"]
    return "\n".join(lines)


def run(args: list[str]) -> int:
    if args[:1] == ["resume"]:
        if len(args) != 2:
            raise ConfigError("usage: bench advise resume DIR")
        return resume(Path(args[1]))
    return start(args)
