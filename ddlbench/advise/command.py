"""`bench advise model=M devices=N [key=value ...]` and `bench advise resume DIR`.

Phases, each resumable (state in DIR/advice.json):
  1. grid + memory estimates; calibration (a sweep in DIR/calibration): 1-rank DDP runs at the
     grid's smallest and largest micro-batch, and (calibrate=frameworks, the default) one 1-rank
     run of every other framework: its compute factor over DDP and its runtime memory overhead;
  2. predictions from the calibration, memory pruning, ranking; the top `budget_runs` (and
     `verify_pruned` of the memory-pruned) measured as a sweep in DIR/measure;
  3. collect: predicted vs measured step time, estimated vs measured memory, rank correlation.
With backend=local the three run in one call; with backend=slurm each sweep is a job array and
`bench advise resume DIR` continues once it has finished. This module drives the phases; each has
its own: options.py (arguments), calibrate.py (1), rank.py (2), conclude.py (3), output.py (printing).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ddlbench.advise.calibrate import BASELINE, calibration_cells, calibration_plan, spread_overrides
from ddlbench.advise.conclude import collect, fold, next_round
from ddlbench.advise.grid import enumerate_grid
from ddlbench.advise.options import ADVICE, default_network, device_memory_bytes, devices_per_node, parse
from ddlbench.advise.output import print_ranking, print_result
from ddlbench.advise.rank import attach_cost, candidate_row, rank_candidates
from ddlbench.advise.state import Advice
from ddlbench.errors import ConfigError
from ddlbench.lifecycle import ownership
from ddlbench.record import rundir
from ddlbench.record.readers import DamagedFile, read_json
from ddlbench.record.results import atomic_write_json


def start(args: list[str]) -> int:
    from ddlbench.estimate.profile import profile
    from ddlbench.machine.device import auto_global_batch, launcher_device
    from ddlbench.machine.gpus import visible_gpus
    from ddlbench.network.model import load
    from ddlbench.planning.config import compose_raw

    opts, extra = parse(args)
    raw = compose_raw([f"model={opts['model']}", *extra])
    run_cfg = raw["run"]
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
    if opts["global_batch"] is None and run_cfg["global_batch"] == "auto":
        opts["global_batch"] = auto_global_batch(device, raw["model"].get("gpu_batch_per_device"), opts["devices"])[0]
    elif opts["global_batch"] is None:
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
    prof = profile(cfg.model, cfg.run.precision, device)
    for c in valid:
        attach_cost(c, prof, per_node)
    across = spread_overrides(opts["devices"], per_node, opts["backend"])
    for c in grid:
        c.overrides = [*c.overrides, *across]
    limit, limit_source = device_memory_bytes(opts, device)
    survivors = [c for c in grid if not c.pruned]
    state = Advice(options=opts, extra_overrides=list(extra), network=network.name,
                   network_source=str(network.source), devices_per_node=per_node, device=device,
                   precision=cfg.run.precision, device_memory_bytes=limit, device_memory_source=limit_source,
                   optimizer={"name": cfg.optim.name, "momentum": cfg.optim.momentum}, profile=prof.to_dict(),
                   candidates=[candidate_row(c, prof, cfg, device) for c in grid])
    threads = None
    if device == "cpu":
        from ddlbench.launch.local import threads_per_rank
        from ddlbench.machine.envinfo import usable_cores
        threads = threads_per_rank(valid[0].plan)
        # ranks x threads over the cores of a node (a node of `bench cluster` has its own), against the
        # 1-rank calibration's
        state.oversubscription = (max(1.0, min(opts["devices"], per_node) * threads / usable_cores())
                                  / max(1.0, threads / usable_cores()))
    overrides, raws = [], []
    for cell in calibration_cells(survivors, opts["calibrate"], opts["devices"], per_node):
        try:
            over, plan, cost = calibration_plan(cell, opts, extra, threads, prof, per_node, limit, device)
        except ConfigError as exc:     # this framework cannot run on one rank: DDP's compute stands in
            state.calibration.skipped[cell["framework"]] = str(exc)
            continue
        raws.append(plan.raw)
        cell["cost_model"] = cost.to_dict() if cost is not None else None
        state.calibration.cells.append(cell)
        overrides.append(over)
    if not state.calibration.cells:
        raise ConfigError("no calibration run can measure one device's compute: "
                          + "; ".join(f"{k}: {v}" for k, v in state.calibration.skipped.items()))
    owner = ownership.take(out, "bench advise", inherited=False)
    if (out / ADVICE).exists():      # another advise got here first
        owner.release()
        raise ConfigError(f"{out} already holds an {ADVICE}; continue it with `bench advise resume {out}`")
    with owner:
        _save(out / ADVICE, state)
        pruned = sum(1 for c in grid if c.pruned)
        print(f"grid: {len(grid)} candidates, {pruned} pruned by validation; calibration: "
              + ", ".join(f"{c['framework']} mb{c['micro_batch']}"
                          + (f" over {c['ranks']} ranks ({_why_ranks(c)})" if c.get("ranks", 1) > 1 else "")
                          for c in state.calibration.cells)
              + " (1 rank unless said)", flush=True)
        _sweep(out / "calibration", overrides, opts["backend"], raws)
        return _resume(out)


def _why_ranks(cell: dict) -> str:
    return "its own collectives" if cell.get("own_collectives") else "DDP does not fit one device"


def _sweep(sweep_dir: Path, overrides: list[list[str]], backend: str, raws: list[dict] | None = None) -> None:
    """`overrides` as a sweep; `raws`: their composed configs where the caller already has them."""
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.sweep.cells import Cell, cell_id
    from ddlbench.sweep.commands import start_cells

    raws = raws or [plan_from_overrides(o).raw for o in overrides]
    cells = [Cell(index=i, id=cell_id(raw), overrides=o, repeat=0) for i, (o, raw) in enumerate(zip(overrides, raws))]
    # a stop says how to go on: the advice resumes its sweeps, not the other way round
    start_cells(sweep_dir, cells, {"overrides": ["(bench advise)"], "repeats": 1,
                                   "resume_command": f"bench advise resume {sweep_dir.parent}"}, backend,
                job_name="ddlbench-advise")


def _results(sweep_dir: Path) -> list[dict | None]:
    from ddlbench.sweep import manifest
    return [manifest.cell_result(sweep_dir, c) for c in manifest.read(sweep_dir)]


def resume(out: Path) -> int:
    if not (Path(out) / ADVICE).is_file():
        raise ConfigError(f"{out}: not an advise directory (no {ADVICE})")
    with ownership.take(Path(out), "bench advise", inherited=False):
        return _resume(out)


def _resume(out: Path) -> int:
    path = Path(out) / ADVICE
    if not path.is_file():
        raise ConfigError(f"{out}: not an advise directory (no {ADVICE})")
    try:
        state = Advice.from_json(read_json(path, "advice"))
    except DamagedFile:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: not an advice this version can continue ({exc})") from None
    if state.options.get("backend") not in ("local", "slurm"):
        raise ConfigError(f"{path}: not an advice this version can continue (options.backend must be local or "
                          f"slurm, got {state.options.get('backend')!r})")
    if state.phase == "calibrate":
        results = _finished(Path(out), "calibration", state.options["backend"])
        if results is None:
            return 1 if state.options["backend"] == "local" else 0
        for cell, r in zip(state.calibration.cells, results):
            if r["status"] != "ok" and cell["framework"] == BASELINE:
                raise ConfigError(f"the DDP calibration run failed ({r['status']}): {r['error']}")
        rank_candidates(state, results)
        chosen = [c for c in state.candidates if c.get("measure")]
        state.phase = "measure" if chosen else "done"
        state.rounds = [_first_round(state)] if chosen else []
        _save(path, state)
        print_ranking(state)
        if chosen:
            _sweep(out / "measure", [c["overrides"] for c in chosen], state.options["backend"])
    while state.phase == "measure":
        rounds = state.rounds
        last = rounds[-1]
        if not last.get("folded"):
            results = _finished(Path(out), last["dir"], state.options["backend"])
            if results is None:
                return 1 if state.options["backend"] == "local" else 0
            fold(state, [cid for cid, _ in last["cells"]], results)
            last["folded"] = True
        cells, why = next_round(state)
        if cells:
            rounds.append({"dir": f"measure-{len(rounds) + 1}", "cells": cells, "why": why})
            _save(path, state)
            by_id = {c["id"]: c for c in state.candidates}
            print(f"advise: measuring ({why}): " + ", ".join(f"{by_id[i]['label']} (run {n + 1})" for i, n in cells),
                  flush=True)
            _sweep(out / rounds[-1]["dir"], [by_id[i]["overrides"] + ([f"run.repeat={n}"] if n else []) for i, n in cells],
                   state.options["backend"])
            continue
        collect(state)
        state.phase = "done"
        _save(path, state)
    print_result(state, out)
    return 0


def _save(path: Path, state: Advice) -> None:
    atomic_write_json(path, state.to_json())


def _first_round(state: Advice) -> dict:
    return {"dir": "measure", "cells": [[c["id"], 0] for c in state.candidates if c.get("measure")], "why": "first"}


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


def run(args: list[str]) -> int:
    if args[:1] == ["resume"]:
        if len(args) != 2:
            raise ConfigError("usage: bench advise resume DIR")
        return resume(Path(args[1]))
    return start(args)
