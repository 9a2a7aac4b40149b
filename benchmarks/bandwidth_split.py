"""Bandwidth across two network dimensions, measured against the network model: for a fixed
per-device budget, several splits between the device links (dev_link, within a node) and the
nodes' uplinks (link, across nodes), each on its own `bench cluster` (2 nodes x 2 devices), and
at each split

  measured   the all-reduce of the DDP step's gradient bytes as a flat ring and hierarchically
             (`bench commbench`), and the step time of a 4-rank DDP run (gpt2_tiny, gloo;
             --framework fsdp_hybrid for hierarchical collectives in the step)
  predicted  the same from the network model (ddlbench/network/model.py) with the split's rates:
             the collectives directly, the step as compute + exposed communication
             (ddlbench/project/projection.py), compute taken from the first split's run

and the split `bench project allocate=time` chooses for this workload and budget
(ddlbench/project/allocate.py, gloo's flat ring), set beside the measured fastest. The budget is
per device: dev_link + the device's share of its node's uplink (link / devices per node), the
network model's terms. Root and Slurm as `bench cluster` needs; on a 2-core machine the four
devices share the cores: keep the rates low enough that the links set the pace (the defaults).

With `--objective perf_per_cost --costs 1,2 --device-cost X` it holds `allocate=perf_per_cost`
(throughput per cost, cost = X + sum of cost_i x bandwidth_i per device) against measurement
instead: a calibration run at the time-optimal split, the model's choice, then the choice scaled by
--scales on both dimensions, each point's measured samples/s per device per cost beside the
model's.

With `--objective flat` it asks whether the intermediate dimension shortens the step: the same four
devices on one flat switch (one node, every device link at the whole per-device budget) beside the
two-level cluster at its best split (run with --objective time first, into the same OUT_DIR).

    .venv/bin/python benchmarks/bandwidth_split.py OUT_DIR [--total-mbit 300] [--fractions 0.2,0.4,...]
    .venv/bin/python benchmarks/bandwidth_split.py OUT_DIR --objective perf_per_cost --costs 1,2 --device-cost 0.015
    .venv/bin/python benchmarks/bandwidth_split.py OUT_DIR --objective flat [--flat-mbit 200]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from runs import reuse

REPO = Path(__file__).resolve().parents[1]
BENCH = str(REPO / ".venv" / "bin" / "bench")
NAME = "ddlbsplit"
NODES, DEVICES = 2, 2
FRACTIONS = (0.2, 0.4, 0.5, 0.6, 2 / 3, 0.8, 0.9)
SCALES = (0.5, 0.7, 1.0, 1.4, 2.0)
RUN = {"framework": "ddp", "mtu": 9000}   # set once from --framework and --mtu (main)


def split_rates(total_mbit: float, fraction: float, devices: int = DEVICES) -> tuple[float, float]:
    """(dev_link, link) in Mbit/s for `fraction` of the per-device budget on the device link: the
    rest is the device's share of the node uplink, which carries `devices` such shares."""
    if not 0 < fraction < 1:
        raise ValueError("the fraction on the device link is within (0, 1)")
    return total_mbit * fraction, total_mbit * (1 - fraction) * devices


def cluster(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, "cluster", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def login(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)


def measure(out: Path, dev_mbit: float, link_mbit: float, size: int, resume: bool = False,
            nodes: int = NODES) -> dict:
    """One split: the cluster up, commbench, a DDP run, the cluster down (--resume: read back a
    split measured before; its predictions are made again)."""
    if not reuse(out / "run", resume, resumable=True):
        _measure(out, dev_mbit, link_mbit, size, nodes)
    rows = json.loads((out / "commbench" / "commbench.json").read_text())["rows"]
    rec = json.loads((out / "run" / "result.json").read_text())
    return {"flat_s": next(r["time_s"] for r in rows if r["kind"] == "all_reduce"),
            "hier_s": next((r["time_s"] for r in rows if r["kind"] == "all_reduce_hier"), None),
            "step_s": rec["timing"]["window_step_s"], "step_p10_s": rec["timing"]["step_time_s"]["p10"],
            "step_p90_s": rec["timing"]["step_time_s"]["p90"], "record": str(out / "run" / "result.json")}


def _measure(out: Path, dev_mbit: float, link_mbit: float, size: int, nodes: int = NODES) -> None:
    devices = NODES * DEVICES // nodes
    cluster("down", f"name={NAME}")
    up = cluster("up", f"nodes={nodes}", f"devices_per_node={devices}", f"link={link_mbit:.3f}mbit",
                 f"dev_link={dev_mbit:.3f}mbit", f"mtu={RUN['mtu']}", f"name={NAME}")
    if up.returncode:
        raise SystemExit(f"bench cluster up failed: {up.stderr[-1500:]}")
    try:
        srun = ("srun", f"-N{nodes}", f"--ntasks-per-node={devices}", "--kill-on-bad-exit=1", BENCH)
        kinds = "all_reduce,all_reduce_hier" if nodes > 1 else "all_reduce"   # one switch: no hierarchy
        cb = login(*srun, "commbench", "launcher=slurm", f"kinds=[{kinds}]", f"sizes=[{size}]",
                   "iters=5", f"out={out / 'commbench'}")
        if cb.returncode:
            raise SystemExit(f"commbench failed: {cb.stderr[-1500:]}")
        run = login(*srun, "run", "launcher=slurm", f"framework={RUN['framework']}", "model=gpt2_tiny", "debug=fast",
                    f"launcher.nproc={NODES * DEVICES}", "run.measure_steps=10", f"run.dir={out / 'run'}",
                    "run.timeout_s=300")
        if run.returncode:
            raise SystemExit(f"the DDP run failed: {run.stdout[-800:]} {run.stderr[-1500:]}")
    finally:
        cluster("down", f"name={NAME}")


def predict(network, work, compute_s: float, dev_mbit: float, share_mbit: float, size: int) -> dict:
    from ddlbench.network.model import GLOO, collective_time, hierarchical, layout
    from ddlbench.project.projection import exposed_time
    net = network.with_bandwidths([dev_mbit * 1e6 / 8, share_mbit * 1e6 / 8])
    spans = list(zip(layout(net, NODES * DEVICES), net.dims))
    return {"flat_s": collective_time("all_reduce", size, spans, GLOO)[0],
            # commbench's hierarchical all-reduce is made of gloo's collectives
            "hier_s": hierarchical("all_reduce", size, spans, gloo=True),
            "step_s": compute_s + exposed_time(work, net, NODES * DEVICES, GLOO, measured_groups=True)}


def gradient_bytes() -> int:
    """The DDP step's gradient all-reduce: gpt2_tiny's parameters in fp32."""
    import torch

    from ddlbench.models.registry import build
    from ddlbench.models.spec import count_params
    from ddlbench.planning.config import plan_from_overrides
    with torch.device("meta"):
        return 4 * count_params(build(plan_from_overrides(["model=gpt2_tiny"]).cfg.model, "cpu").factory())


def calibrate(record_path: str):
    """(network as the cluster described it, the run's workload, its compute seconds: the step
    less the modelled exposed communication)."""
    from ddlbench.network.model import GLOO, from_dict
    from ddlbench.project.projection import compute_seconds
    from ddlbench.project.workload import from_record
    rec = json.loads(Path(record_path).read_text())
    network, work = from_dict(rec["env"]["network"]["description"]), from_record(rec)
    return network, work, compute_seconds(work, measured_on=network, algorithm=GLOO)[0]


def point(out: Path, dev: float, link: float, size: int, calib, resume: bool = False) -> dict:
    got = measure(out, dev, link, size, resume)
    if calib is None:
        calib = calibrate(got["record"])
    pred = predict(*calib, dev, link / DEVICES, size)
    print(f"dev {dev:7.1f} link {link:7.1f} Mbit/s | flat {got['flat_s'] * 1e3:7.1f} ms (model "
          f"{pred['flat_s'] / got['flat_s']:.2f}x) | hier {got['hier_s'] * 1e3:7.1f} ms (model "
          f"{pred['hier_s'] / got['hier_s']:.2f}x) | step {got['step_s'] * 1e3:7.1f} ms (model "
          f"{pred['step_s'] / got['step_s']:.2f}x)", flush=True)
    return {"dev_link_mbit": dev, "link_mbit": link, "measured": got, "predicted": pred}, calib


def time_budget(a, size: int) -> dict:
    from ddlbench.network.model import GLOO
    from ddlbench.project.allocate import allocate
    rows, calib = [], None
    for f in [float(x) for x in a.fractions.split(",")]:
        row, calib = point(a.out / f"split-{f:.3f}", *split_rates(a.total_mbit, f), size, calib, a.resume)
        rows.append({"fraction": f, **row})
    network, work, compute_s = calib
    best = min(rows, key=lambda r: r["measured"]["step_s"])
    chosen = allocate(work, network, NODES * DEVICES, compute_s, objective="time",
                      budget_GBps=a.total_mbit * 1e6 / 8 / 1e9, min_GBps=1e-4, algorithm=GLOO)
    chosen_dev_mbit = chosen["bandwidth_GBps"][0] * 8e3
    nearest = min(rows, key=lambda r: abs(r["dev_link_mbit"] - chosen_dev_mbit))
    within = nearest["measured"]["step_s"] <= best["measured"]["step_p90_s"]
    print(f"measured fastest step: dev_link {best['dev_link_mbit']:.1f} Mbit/s ({best['measured']['step_s'] * 1e3:.1f} ms); "
          f"the model's choice: dev_link {chosen_dev_mbit:.1f} Mbit/s, measured at the nearest split "
          f"{nearest['measured']['step_s'] * 1e3:.1f} ms: {'within' if within else 'outside'} the fastest split's "
          f"p90 step ({best['measured']['step_p90_s'] * 1e3:.1f} ms)")
    return {"objective": "time", "total_mbit": a.total_mbit, "size_bytes": size, "compute_s": compute_s, "rows": rows,
            "measured_best": {"dev_link_mbit": best["dev_link_mbit"], "step_s": best["measured"]["step_s"]},
            "model_choice": {"dev_link_mbit": chosen_dev_mbit, "step_s": chosen["step_s"],
                             "nearest_measured_split": nearest["dev_link_mbit"],
                             "its_measured_step_s": nearest["measured"]["step_s"],
                             "within_the_best_splits_p90": within}}


def per_cost(samples_per_s: float, dev_mbit: float, share_mbit: float, costs: list[float], device_cost: float) -> float:
    """Samples/s per device per cost unit: cost = device_cost + cost_node x dev + cost_link x share
    (GB/s per device)."""
    return samples_per_s / (NODES * DEVICES) / (device_cost + costs[0] * dev_mbit / 8e3 + costs[1] * share_mbit / 8e3)


def perf_per_cost(a, size: int) -> dict:
    from ddlbench.network.model import GLOO, Network
    from ddlbench.project.allocate import allocate
    costs = [float(c) for c in a.costs.split(",")]
    calib_row, calib = point(a.out / "calibration", *split_rates(a.total_mbit, 2 / 3), size, None, a.resume)
    network, work, compute_s = calib
    priced = Network(network.name, tuple(replace(d, cost_per_GBps=c) for d, c in zip(network.dims, costs)),
                     network.description)
    chosen = allocate(work, priced, NODES * DEVICES, compute_s, objective="perf_per_cost", min_GBps=1e-3,
                      max_GBps=0.2, algorithm=GLOO, device_cost=a.device_cost)
    dev0, share0 = (b * 8e3 for b in chosen["bandwidth_GBps"])
    print(f"the model's choice at costs {costs} per GB/s, a device {a.device_cost}: dev_link {dev0:.1f}, "
          f"uplink share {share0:.1f} Mbit/s per device ({'converged' if chosen['converged'] else chosen['message']})")
    rows = []
    for k in [float(x) for x in a.scales.split(",")]:
        row, _ = point(a.out / f"scale-{k:.2f}", dev0 * k, share0 * k * DEVICES, size, calib, a.resume)
        m, p = row["measured"], row["predicted"]
        batch = NODES * DEVICES * work.per_device_batch          # the global batch: samples a step
        row.update(scale=k, measured_per_cost=per_cost(batch / m["step_s"], dev0 * k, share0 * k, costs, a.device_cost),
                   measured_per_cost_at_p90=per_cost(batch / m["step_p90_s"], dev0 * k, share0 * k, costs,
                                                     a.device_cost),
                   predicted_per_cost=per_cost(batch / p["step_s"], dev0 * k, share0 * k, costs, a.device_cost))
        rows.append(row)
    best = max(rows, key=lambda r: r["measured_per_cost"])
    mine = next(r for r in rows if r["scale"] == 1.0)
    within = mine["measured_per_cost"] >= best["measured_per_cost_at_p90"]
    print(f"measured best per cost: scale {best['scale']} ({best['measured_per_cost']:.1f}); the model's choice "
          f"(scale 1): {mine['measured_per_cost']:.1f}: {'within' if within else 'outside'} the best point's "
          f"p90-step value ({best['measured_per_cost_at_p90']:.1f})")
    return {"objective": "perf_per_cost", "costs_per_GBps": costs, "device_cost": a.device_cost, "size_bytes": size,
            "compute_s": compute_s, "calibration": calib_row, "model_choice": chosen, "rows": rows,
            "measured_best_scale": best["scale"], "choice_within_the_best_points_p90": within}


def flat_switch(a, size: int) -> dict:
    """The four devices on one switch at the whole budget each, beside the two-level cluster's
    best split (bandwidth_split_time.json in OUT_DIR); both predicted by the model."""
    from ddlbench.network.model import GLOO, collective_time, from_dict
    from ddlbench.project.projection import exposed_time
    from ddlbench.project.workload import from_record
    two = json.loads((a.out / "bandwidth_split_time.json").read_text())
    best = min(two["rows"], key=lambda r: r["measured"]["step_s"])
    # one node: its "link" to the head's switch carries nothing; give it the same rate
    rate = a.flat_mbit or a.total_mbit
    got = measure(a.out / f"flat-{rate:.0f}", rate, rate, size, a.resume, nodes=1)
    rec = json.loads(Path(got["record"]).read_text())
    net, work = from_dict(rec["env"]["network"]["description"]), from_record(rec)
    spans = [(NODES * DEVICES, net.dims[0])]
    pred = {"flat_s": collective_time("all_reduce", size, spans, GLOO)[0],
            "step_s": two["compute_s"] + exposed_time(work, net, NODES * DEVICES, GLOO, measured_groups=True)}
    print(f"flat switch, {rate:.0f} Mbit/s a device: all-reduce {got['flat_s'] * 1e3:.1f} ms (model "
          f"{pred['flat_s'] / got['flat_s']:.2f}x), step {got['step_s'] * 1e3:.1f} ms (model "
          f"{pred['step_s'] / got['step_s']:.2f}x); two levels at their best split (dev_link "
          f"{best['dev_link_mbit']:.0f}, link {best['link_mbit']:.0f} Mbit/s): step {best['measured']['step_s'] * 1e3:.1f} ms "
          f"(model {best['predicted']['step_s'] * 1e3:.1f} ms)")
    return {"objective": "flat", "total_mbit": a.total_mbit, "flat_mbit": rate, "size_bytes": size,
            "flat_switch": {"measured": got, "predicted": pred},
            "two_levels_best": {k: best[k] for k in ("dev_link_mbit", "link_mbit", "measured", "predicted")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--objective", choices=("time", "perf_per_cost", "flat"), default="time")
    ap.add_argument("--total-mbit", type=float, default=300.0, help="per-device budget: dev_link + uplink share")
    ap.add_argument("--fractions", default=",".join(f"{f:.4f}" for f in FRACTIONS),
                    help="time: the budget's fraction on the device link, one split each")
    ap.add_argument("--costs", default="1,2", help="perf_per_cost: cost per GB/s per device, node,link")
    ap.add_argument("--device-cost", type=float, default=0.015, help="perf_per_cost: a device's own cost")
    ap.add_argument("--scales", default=",".join(map(str, SCALES)), help="perf_per_cost: the choice scaled by")
    ap.add_argument("--flat-mbit", type=float, help="flat: each device's link (default: --total-mbit; "
                    "at equal cost with --costs 1,2 the two-level best split's cost / 2)")
    ap.add_argument("--framework", default="ddp", help="the data-parallel strategy run at each split (fsdp_hybrid: "
                    "reduce-scatter and all-gather within the node, all-reduce across)")
    ap.add_argument("--mtu", type=int, default=9000, help="the cluster's MTU (jumbo frames: at 1500 TCP/IP "
                    "headers and acknowledgements take 4-8%% of a 100 Mbit/s link)")
    ap.add_argument("--resume", action="store_true", help="read back the splits OUT_DIR holds; predict them again")
    a = ap.parse_args()
    RUN.update(framework=a.framework, mtu=a.mtu)
    a.out.mkdir(parents=True, exist_ok=True)
    size = gradient_bytes()
    summary = {"time": time_budget, "perf_per_cost": perf_per_cost, "flat": flat_switch}[a.objective](a, size)
    summary["mtu"] = a.mtu
    name = a.objective + (f"_{a.flat_mbit:.0f}" if a.objective == "flat" and a.flat_mbit else "")
    (a.out / f"bandwidth_split_{name}.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
