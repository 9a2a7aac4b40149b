"""The projector's schedule held against measurement on `bench cluster` (2 nodes x 2 devices, shaped
links), every layout family it prices: each layout's step predicted from a ONE-device calibration
(a 1-rank run on one device of the same cluster) and the cluster's network description, beside the
step measured at 4 ranks.

    .venv/bin/python benchmarks/layout_check.py OUT_DIR [--link 100mbit] [--dev-link 200mbit]
        [--model llama_tiny] [--layouts ddp,fsdp_full,...] [--repeats 2] [--resume] [--devices-per-node 1]
    .venv/bin/python benchmarks/layout_check.py OUT_DIR --reprice [--own-steps-again]   # no cluster

With --devices-per-node 1 the cluster is 2 nodes x 1 device (world 2, every rank on a core of its
own; LAYOUTS_ONE_PER_NODE: DDP, FSDP2, TP 2, PP 2, CP 2, Ulysses 2, EP 2). At 2 x 2 a commbench
between a node's two devices also prices the node dimension by its fit, a second prediction beside
the first. Expert parallelism runs moe_tiny (a layout's own `model=`), ring attention and Ulysses
the attention they need; each layout's 1-device calibration runs the same model.

For each layout (LAYOUTS): `srun -N2 --ntasks-per-node=2 bench run launcher=slurm ...` (4 ranks, the
global batch 4 x PER_RANK samples over the data-parallel ranks), and a 1-rank run of its calibration
framework (the layout's own where it plans at one rank, else the one named) on one device
(`srun -N1 -n1`); at 2 x 2 the same 1-rank run also on both devices of a node at once (each its own
run: how much slower a device computes with its neighbour busy on the node's one core, `sharing`;
2.0 would be perfect turns). The prediction is `ddlbench/project/spec.py` as `bench project` runs
it: the roofline's efficiency solved so that the 1-rank step is reproduced, divided by that measured
slowdown (where it was not measured, the CPU oversubscription of the 4-rank run,
ddlbench/project/validate.py: the 2 devices of a node share its one core here), the layout planned
at 4 ranks, its collectives priced on the network the run
recorded (the cluster's link rates, gloo's flat rings), the step simulated with the framework's
rules (ddlbench/estimate/rules.py). Where the layout splits a rank's compute (tp, cp or ep > 1), its
own step over a fake process group against the calibration framework's at one rank sets its compute
(own_steps); where a node's ranks share its core, the schedule knows (Spec.ranks_per_core: a
pipeline's replicas take turns on it). Root and Slurm as `bench cluster` needs; on a 2-core machine
keep the rates low enough that the links set the pace. Writes OUT_DIR/layout_check.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from runs import reuse

REPO = Path(__file__).resolve().parents[1]
BENCH = str(Path(sys.executable).parent / "bench")
NAME = "ddlblayout"
NODES = 2
DEVICES = 2           # per node; --devices-per-node 1: one device (one core) per node, world 2
PER_RANK = 4
# layout -> (its overrides, the framework its 1-device calibration runs)
LAYOUTS = {
    "ddp": (["framework=ddp"], "ddp"),
    "fsdp_full": (["framework=fsdp_full"], "fsdp_full"),
    "fsdp_hybrid": (["framework=fsdp_hybrid"], "fsdp_full"),
    "tp2_fsdp2": (["framework=tensor_parallel_fsdp"], "tensor_parallel"),   # DTensor at tp 1: its per-op cost
    "pp2_dp2": (["framework=pipeline_1f1b", "framework.options.pp=2", "framework.options.dp=2"], "ddp"),
    "zero2": (["framework=deepspeed_zero2"], "deepspeed_zero2"),
    "cp2_fsdp2": (["framework=context_parallel", "model.attention=sdpa_causal"], "fsdp_full"),
    "ulysses2_dp2": (["framework=deepspeed_ulysses", "framework.options.sp=2", "model.attention=sdpa"],
                     "deepspeed_zero2"),
    "ep2_fsdp2": (["framework=expert_parallel", "model=moe_tiny"], "fsdp_full"),
}
# one device per node (world 2): the model-parallel layouts across the node link, each rank on a core of its own
LAYOUTS_ONE_PER_NODE = {
    "ddp": (["framework=ddp"], "ddp"),
    "fsdp_full": (["framework=fsdp_full"], "fsdp_full"),
    "tp2": (["framework=tensor_parallel"], "tensor_parallel"),
    "pp2": (["framework=pipeline_1f1b", "framework.options.pp=2"], "ddp"),
    "cp2": (["framework=context_parallel", "model.attention=sdpa_causal"], "fsdp_full"),
    "ulysses2": (["framework=deepspeed_ulysses", "framework.options.sp=2", "model.attention=sdpa"], "deepspeed_zero2"),
    "ep2": (["framework=expert_parallel", "model=moe_tiny"], "fsdp_full"),
}


def model_side(layout: list[str], model: str) -> list[str]:
    """The layout's model overrides (a model of its own: moe_tiny for expert parallelism; the
    attention ring attention or Ulysses needs), with `model` where it names none: its 1-device
    calibration runs the same model."""
    own = [o for o in layout if o.startswith("model")]
    return own if any(o.startswith("model=") for o in own) else [f"model={model}", *own]


def strategy_side(layout: list[str]) -> list[str]:
    return [o for o in layout if not o.startswith("model")]
OWN_ROUNDS = 3       # own_steps: each of its two timings this many times, in turn; the medians stand
STEPS = ["run.warmup_steps=3", "run.measure_steps=15", "run.progress=false", "logger=none", "run.timeout_s=600"]


def cluster(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, "cluster", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def login(*cmd: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)


def srun(run_dir: Path, nodes: int, per_node: int, overrides: list[str], resume: bool) -> dict:
    if not reuse(run_dir, resume):
        login("srun", f"-N{nodes}", f"--ntasks-per-node={per_node}", "--overcommit", "--kill-on-bad-exit=1", BENCH,
              "run", "launcher=slurm", f"launcher.nproc={nodes * per_node}", f"run.dir={run_dir}", *overrides)
    return result(run_dir)


def result(run_dir: Path) -> dict:
    """The run's result.json, or a 'no result' record naming the directory (a run that wrote none)."""
    path = run_dir / "result.json"
    return json.loads(path.read_text()) if path.exists() else {"status": "no result", "error": {"message": str(run_dir)}}


def median_run(out: Path, nodes: int, per_node: int, overrides: list[str], a) -> dict:
    """a.repeats runs; the one whose window step is the median stands for the point."""
    recs = [srun(out / f"rep{k}", nodes, per_node, overrides, a.resume) for k in range(a.repeats)]
    bad = [r for r in recs if r.get("status") != "ok"]
    if bad:
        return bad[0]
    recs.sort(key=lambda r: r["timing"]["window_step_s"])
    rec = recs[(len(recs) - 1) // 2]
    rec["_repeats_step_s"] = [r["timing"]["window_step_s"] for r in recs]
    return rec


def pair_runs(out: Path, overrides: list[str], a) -> list[dict]:
    """The 1-device calibration on every device of one node at once (`srun -N1 --ntasks-per-node=DEVICES`,
    each task a 1-rank run of its own in its device: `launcher=local launcher.nproc=1`), a.repeats
    times: the device as a rank of the layout has it, the node's other device computing beside it."""
    recs = []
    for k in range(a.repeats):
        run_dir = out / f"rep{k}"
        if not all(reuse(run_dir / f"dev{d}", a.resume) for d in range(DEVICES)):
            login("srun", "-N1", f"--ntasks-per-node={DEVICES}", "--overcommit", "--kill-on-bad-exit=1", "bash", "-c",
                  f'exec "$0" run launcher=local launcher.nproc=1 run.dir={run_dir}/dev$SLURM_LOCALID "$@"',
                  BENCH, *overrides)
        recs += [result(run_dir / f"dev{d}") for d in range(DEVICES)]
    return recs


def sharing(one: dict, pairs: list[dict]) -> dict | None:
    """How much slower a device computes with its node's other device busy: the median step of the
    paired calibrations over the lone one's (2.0 where two devices take perfect turns on one core;
    more where they also evict each other's caches). None where a paired run failed."""
    if not pairs or any(r.get("status") != "ok" for r in pairs):
        return None
    steps = [r["timing"]["window_step_s"] for r in pairs]
    return {"factor": statistics.median(steps) / one["timing"]["window_step_s"], "paired_step_s": steps}


def local_batch(layout: list[str], model: str) -> int:
    """Samples per data-parallel rank of the layout at 4 ranks and PER_RANK x 4 samples."""
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides([*strategy_side(layout), *model_side(layout, model), f"launcher.nproc={NODES * DEVICES}",
                                f"run.global_batch={PER_RANK * NODES * DEVICES}"])
    return plan.dims.global_batch // plan.dims.dp


def node_commbench(out: Path, resume: bool) -> dict:
    """gloo's collectives between the two devices of one node (`srun -N1 --ntasks-per-node=2`,
    back to back: the line's own rate; tbf's bucket, which an op after an idle spell spends, is
    the schedule's to price): what a tensor-parallel group's messages cross."""
    if not (resume and (out / "commbench.json").exists()):
        proc = login("srun", "-N1", f"--ntasks-per-node={DEVICES}", "--overcommit", BENCH, "commbench",
                     "launcher=slurm", "kinds=[all_reduce,all_gather,reduce_scatter]",
                     "sizes=[131072,524288,2097152]", "iters=10", "warmup=2", "gap_ms=0", f"out={out}")
        if proc.returncode:
            raise SystemExit(f"commbench failed: {proc.stderr[-1500:]}")
    return json.loads((out / "commbench.json").read_text())


def without_bucket(network):
    """The same links without tbf's token bucket (burst_bytes 0): what the schedule priced before
    it knew of the bucket, for comparison."""
    import dataclasses
    return dataclasses.replace(network, dims=tuple(dataclasses.replace(d, burst_bytes=0.0) for d in network.dims))


def node_fitted(base: dict, bench: dict) -> dict:
    """The cluster's description with its node dimension (a device's link into its node's switch)
    priced by the commbench fits, each kind by its own (ddlbench/network/fit.py)."""
    from ddlbench.network.fit import fits, fitted_network
    got = fits(bench["rows"], bench["world_size"], bench["backend"])
    main = next(f for f in got if f["kind"] == "all_reduce")
    return fitted_network(base, main, bench["world_size"], got)


def own_steps(layout: list[str], calib: str, model: str, local: int, world: int) -> dict | None:
    """Where the layout splits a rank's compute (tp, cp or ep > 1: TP the matmuls, ring attention and
    Ulysses the sequence, EP the experts), what the split costs on the device at hand: rank 0's own
    step at the layout over torch's fake process group (ddlbench/estimate/collectives.time_step:
    collectives return at once) and the calibration framework's own at one rank, each on one thread
    as a rank of the cluster gets. None for a layout that splits nothing (its 1-rank calibration
    computes what a rank does) or that cannot run over a fake group (a pipeline's rank 0 waits on
    its peers)."""
    import os

    from ddlbench.planning.config import compose_raw, plan_from_overrides
    from ddlbench.project.collectives import time_step, traceable
    mine = [*strategy_side(layout), *model_side(layout, model), "run.precision=fp32", "run.device=cpu"]
    plan = plan_from_overrides([*mine, f"launcher.nproc={world}", f"run.global_batch={PER_RANK * world}"])
    d = plan.dims
    if max(d.tp, d.cp, int(getattr(plan.options, "ep", 1))) == 1 or traceable(plan.cfg.framework.name,
                                                                            plan.cfg.framework.variant):
        return None
    cases = {"layout": (compose_raw([*mine, f"launcher.nproc={world}", f"run.global_batch={PER_RANK * world}"]), world),
             "calibration": (compose_raw([f"framework={calib}", *model_side(layout, model), "run.precision=fp32",
                                          "run.device=cpu", "launcher.nproc=1", f"run.global_batch={local}"]), 1)}
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"        # the spawned timing processes: one thread, as a rank here
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    try:        # the two in turn, OWN_ROUNDS times: a slow spell of the host lands on both, not on one
        for _ in range(OWN_ROUNDS):
            for k, (config, ranks) in cases.items():
                got = time_step(config, ranks, 10)
                if "step_s" not in got:
                    raise RuntimeError(f"{k}: {got['error']}")
                rounds[k].append(got["step_s"])
    finally:        # the cluster's runs after this keep the environment they had
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
    return {**{k: statistics.median(v) for k, v in rounds.items()}, "rounds_s": rounds}


def predict(layout_rec: dict, one: dict, layout: list[str], calib: str, model: str, network=None,
            own: dict | None = None, shared: dict | None = None) -> dict:
    """The layout's step at 4 ranks from the 1-rank run: efficiency solved on the 1-rank step,
    scaled by the oversubscription, the layout planned and simulated on `network` (default: the
    one the run recorded, the cluster's configured rates). `own` (own_steps): the layout's compute
    is what its own step over a fake group takes against the calibration framework's at one rank,
    not the share of the FLOPs the roofline gives it. `shared` (sharing): where a node's devices
    share a core, the slowdown measured with the neighbour busy replaces the ranks-per-core ratio."""
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model as net_model
    from ddlbench.project.spec import Spec, rows, solve_efficiency
    from ddlbench.project.validate import oversubscription

    network = network or net_model.recorded_network(layout_rec)
    algorithm = net_model.backend_algorithm(layout_rec["env"]["backend"])
    pricing = Pricing(network, algorithm)
    peak = float(one["flops"]["peak_per_device"])
    par = layout_rec["parallel"]
    local = int(par["global_batch"]) // int(par["dp"])
    common = [*model_side(layout, model), "run.device=cpu", "run.precision=fp32"]
    spec1 = Spec((f"framework={calib}", *common), local, peak, per_node=DEVICES, device="cpu")
    rate1 = one["throughput"]["tokens_per_s"]
    eff1 = solve_efficiency(spec1, pricing, rate1, 1)
    ratio = oversubscription(layout_rec) / oversubscription(one)
    factor = shared["factor"] if shared and ratio > 1 else ratio
    spec = Spec((*strategy_side(layout), *common), local, peak, per_node=DEVICES, device="cpu",
                ranks_per_core=max(1, round(ratio)))
    world = NODES * DEVICES
    split = 1.0
    if own:      # the compute the roofline gives the layout against the calibration's, both at eff1
        by_flops = rows(spec, pricing, [world], eff1)[0]["compute_s"] / rows(spec1, pricing, [1], eff1)[0]["compute_s"]
        split = own["layout"] / own["calibration"] / by_flops
    row = rows(spec, pricing, [world], eff1 / factor / split)[0]
    measured = layout_rec["timing"]["window_step_s"]
    return {"predicted_step_s": row["step_s"], "measured_step_s": measured, "own_steps_s": own, "split_factor": split,
            "error": (row["step_s"] - measured) / measured, "compute_s": row["compute_s"],
            "exposed_comm_s": row["exposed_comm_s"], "exposed_by_kind_s": row["exposed_by_kind_s"],
            "comm_by_kind_s": row["comm_by_kind_s"], "layout": row["layout"], "efficiency_1rank": eff1,
            "oversubscription": ratio, "compute_slowdown": factor, "network": network.name, "algorithm": algorithm,
            "one_rank_step_s": one["timing"]["window_step_s"]}


def markdown(doc: dict) -> str:
    lines = [f"{NODES} nodes x {doc.get('devices_per_node', 2)} devices; links: device {doc['dev_link']}, node "
             f"{doc['link']}; model {doc['model']}, {PER_RANK} samples per "
             f"rank-equivalent; {doc['repeats']} repeats (the median run stands)", "",
             "| layout | planned | measured step ms (repeats) | predicted ms | error | compute ms | exposed comm ms "
             "(by kind) | 1-rank step ms | own step over a fake group / calibration's (ms) "
             "| compute by its FLOPs' share: predicted ms (error) | without tbf's bucket: predicted ms (error) "
             "| node link fitted: predicted ms (error) | a device with its neighbour busy: step ms (x the lone one) "
             "| compute at the ranks-per-core ratio: predicted ms (error) |", "|" + "---|" * 14]
    for r in doc["rows"]:
        if "error_message" in r:
            lines.append(f"| {r['layout']} | - | {r['error_message'][:120]} |" + " |" * 11)
            continue
        p = r["prediction"]
        kinds = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in p["exposed_by_kind_s"].items() if v > 5e-4)
        reps = ", ".join(f"{s * 1e3:.0f}" for s in r["repeats_step_s"])
        lay = p["layout"]
        planned = (" x ".join(f"{k} {lay[k]}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp") if lay.get(k, 1) > 1)
                   + (f" (ep {lay['ep']})" if lay.get("ep", 1) > 1 else "")
                   + f", micro-batch {lay['micro_batch']} x {lay['grad_accum']}")
        lines.append(f"| {r['layout']} | {planned} | {p['measured_step_s'] * 1e3:.0f} ({reps}) | "
                     f"{p['predicted_step_s'] * 1e3:.0f} | {100 * p['error']:+.1f}% | {p['compute_s'] * 1e3:.0f} | "
                     f"{p['exposed_comm_s'] * 1e3:.0f} ({kinds}) | {p['one_rank_step_s'] * 1e3:.0f} | "
                     + (f"{own['layout'] * 1e3:.1f} / {own['calibration'] * 1e3:.1f}" if (own := p.get("own_steps_s"))
                        else "-") + " | "
                     + " | ".join(f"{r[k]['predicted_step_s'] * 1e3:.0f} ({100 * r[k]['error']:+.1f}%)" if k in r else "-"
                                  for k in ("prediction_flops_split", "prediction_no_bucket", "prediction_node_fitted"))
                     + " | " + (f"{statistics.median(sh['paired_step_s']) * 1e3:.0f} (x{sh['factor']:.2f})"
                                if (sh := r.get("sharing")) else "-")
                     + " | " + (f"{q['predicted_step_s'] * 1e3:.0f} ({100 * q['error']:+.1f}%)"
                                if (q := r.get("prediction_ranks_ratio")) else "-") + " |")
    for key, label in (("prediction", "configured rates"), ("prediction_no_bucket", "without tbf's bucket"),
                       ("prediction_node_fitted", "node link fitted"),
                       ("prediction_ranks_ratio", "compute at the ranks-per-core ratio, not the measured sharing")):
        errs = [abs(r[key]["error"]) for r in doc["rows"] if key in r]
        if errs:
            lines += ["", f"{label}: {sum(e <= 0.10 for e in errs)} of {len(errs)} within 10%; mean |error| "
                          f"{100 * statistics.mean(errs):.1f}%, max {100 * max(errs):.1f}%"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--link", default="100mbit")
    ap.add_argument("--dev-link", default="200mbit")
    ap.add_argument("--model", default="llama_tiny")
    ap.add_argument("--layouts", default=None, help="default: every layout of the cluster's shape")
    ap.add_argument("--devices-per-node", type=int, default=2, choices=(1, 2))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--reprice", action="store_true",
                    help="no cluster: price OUT_DIR's recorded runs again with the predictor as it is now")
    ap.add_argument("--own-steps-again", action="store_true",
                    help="with --reprice: each layout's own steps over a fake group measured again (no cluster)")
    a = ap.parse_args()
    out = a.out.resolve()
    if a.reprice:
        return reprice(out, a)
    out.mkdir(parents=True, exist_ok=True)
    global DEVICES
    DEVICES = a.devices_per_node
    known = LAYOUTS if DEVICES == 2 else LAYOUTS_ONE_PER_NODE
    names = [n for n in (a.layouts or ",".join(known)).split(",") if n]
    unknown = set(names) - set(known)
    if unknown:
        raise SystemExit(f"unknown layouts {sorted(unknown)}; known: {', '.join(known)}")
    cluster("down", f"name={NAME}")
    shape = [f"devices_per_node={DEVICES}", f"dev_link={a.dev_link}"] if DEVICES > 1 else []
    up = cluster("up", f"nodes={NODES}", f"link={a.link}", *shape, f"name={NAME}")
    if up.returncode:
        raise SystemExit(f"bench cluster up failed: {up.stderr[-1500:]}")
    doc = {"link": a.link, "dev_link": a.dev_link if DEVICES > 1 else None, "devices_per_node": DEVICES,
           "model": a.model, "repeats": a.repeats, "rows": []}
    try:
        node = node_commbench(out / "commbench_node", a.resume) if DEVICES > 1 else None
        if node:
            doc["commbench_node"] = str(out / "commbench_node" / "commbench.json")
        ones: dict[str, dict] = {}
        shares: dict[str, dict | None] = {}
        for name in names:
            layout, calib = known[name]
            models = model_side(layout, a.model)
            base = [*models, *STEPS]
            local = local_batch(layout, a.model)      # the 1-device run computes one data-parallel rank's batch
            key = "_".join([calib, *(m.split("=")[1] for m in models[1:]), f"b{local}"])
            if models[0] != f"model={a.model}":
                key = f"{models[0].split('=')[1]}_{key}"
            one_overrides = [f"framework={calib}", *base, f"run.global_batch={local}"]
            if key not in ones:
                ones[key] = median_run(out / "one_rank" / key, 1, 1, one_overrides, a)
                if DEVICES > 1:
                    shares[key] = sharing(ones[key], pair_runs(out / "one_rank" / key / "paired", one_overrides, a))
            one = ones[key]
            rec = median_run(out / name, NODES, DEVICES, [*strategy_side(layout), *base,
                                                          f"run.global_batch={PER_RANK * NODES * DEVICES}"], a)
            row = {"layout": name, "overrides": layout, "calibration": key, "run_dir": str(out / name)}
            if rec.get("status") != "ok" or one.get("status") != "ok":
                bad = rec if rec.get("status") != "ok" else one
                row["error_message"] = f"{bad.get('status')}: {(bad.get('error') or {}).get('message')}"
            else:
                try:
                    row["sharing"] = shares.get(key)
                    price(row, rec, one, layout, calib, a.model, node,
                          own_steps(layout, calib, a.model, local, NODES * DEVICES))
                except Exception as exc:        # a layout the projector refuses: said, not hidden
                    row["error_message"] = f"not predicted: {exc}"
            doc["rows"].append(row)
            print(markdown({**doc, "rows": [row]}).splitlines()[4], flush=True)
    finally:
        cluster("down", f"name={NAME}")
    return write(out, doc)


def price(row: dict, rec: dict, one: dict, layout: list[str], calib: str, model: str, node: dict | None,
          own: dict | None) -> None:
    """The row's predictions of its measured run: as configured (the compute slowed by the measured
    sharing of a node's core where row['sharing'] has it), without tbf's bucket, by the FLOPs' share
    (where `own` steps set the compute), with the node link fitted (where `node` commbench ran), and
    with the ranks-per-core ratio in place of the measured sharing (where it was measured)."""
    from ddlbench.network import model as net_model
    shared = row.get("sharing")
    row["prediction"] = predict(rec, one, layout, calib, model, own=own, shared=shared)
    row["repeats_step_s"] = rec["_repeats_step_s"]
    row["prediction_no_bucket"] = predict(rec, one, layout, calib, model,
                                          without_bucket(net_model.recorded_network(rec)), own, shared)
    if own:
        row["prediction_flops_split"] = predict(rec, one, layout, calib, model, shared=shared)
    if node:
        from ddlbench.network.model import from_dict
        fitted = from_dict(node_fitted(rec["env"]["network"]["description"], node))
        row["prediction_node_fitted"] = predict(rec, one, layout, calib, model, fitted, own, shared)
    if shared:
        row["prediction_ranks_ratio"] = predict(rec, one, layout, calib, model, own=own)


def reprice(out: Path, a) -> int:
    """--reprice: the check's runs priced again with the predictor as it is now, no cluster: its runs,
    1-rank calibrations, node commbench and each layout's own steps as OUT/layout_check.json recorded."""
    global DEVICES
    doc = json.loads((out / "layout_check.json").read_text())
    DEVICES = doc.get("devices_per_node", 2)
    known = LAYOUTS if DEVICES == 2 else LAYOUTS_ONE_PER_NODE
    node = json.loads(Path(doc["commbench_node"]).read_text()) if doc.get("commbench_node") else None
    a.resume, a.repeats = True, doc["repeats"]
    for row in doc["rows"]:
        if "prediction" not in row:
            continue
        layout, calib = known[row["layout"]]
        one = median_run(out / "one_rank" / row["calibration"], 1, 1, [], a)
        rec = median_run(Path(row["run_dir"]), NODES, DEVICES, [], a)
        own = row["prediction"].get("own_steps_s")
        if own and a.own_steps_again:
            own = own_steps(layout, calib, doc["model"], local_batch(layout, doc["model"]), NODES * DEVICES)
        price(row, rec, one, layout, calib, doc["model"], node, own)
    return write(out, doc)


def write(out: Path, doc: dict) -> int:
    (out / "layout_check.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "layout_check.md").write_text(markdown(doc) + "\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
