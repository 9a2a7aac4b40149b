"""Bandwidth across two network dimensions, measured against the network model: for a fixed
per-device budget, several splits between the device links (dev_link, within a node) and the
nodes' uplinks (link, across nodes), each on its own `bench cluster` (2 nodes x 2 devices), and
at each split

  measured   the all-reduce of the DDP step's gradient bytes as a flat ring and hierarchically
             (`bench commbench`), and the step time of a 4-rank DDP run (gpt2_tiny, gloo)
  predicted  the same from the network model (ddlbench/network/model.py) with the split's rates:
             the collectives directly, the step as compute + exposed communication
             (ddlbench/network/project.py), compute taken from the first split's run

and the split `bench project allocate=time` chooses for this workload and budget
(ddlbench/network/allocate.py, gloo's flat ring), set beside the measured fastest. The budget is
per device: dev_link + the device's share of its node's uplink (link / devices per node), the
network model's terms. Root and Slurm as `bench cluster` needs; on a 2-core machine the four
devices share the cores: keep the rates low enough that the links set the pace (the defaults).

    .venv/bin/python benchmarks/bandwidth_split.py OUT_DIR [--total-mbit 300] [--fractions 0.2,0.4,...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = str(REPO / ".venv" / "bin" / "bench")
NAME = "ddlbsplit"
NODES, DEVICES = 2, 2
FRACTIONS = (0.2, 0.4, 0.5, 0.6, 2 / 3, 0.8, 0.9)


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


def measure(out: Path, dev_mbit: float, link_mbit: float, size: int) -> dict:
    """One split: the cluster up, commbench, a DDP run, the cluster down."""
    cluster("down", f"name={NAME}")
    up = cluster("up", f"nodes={NODES}", f"devices_per_node={DEVICES}", f"link={link_mbit:.3f}mbit",
                 f"dev_link={dev_mbit:.3f}mbit", f"name={NAME}")
    if up.returncode:
        raise SystemExit(f"bench cluster up failed: {up.stderr[-1500:]}")
    try:
        srun = ("srun", f"-N{NODES}", f"--ntasks-per-node={DEVICES}", "--kill-on-bad-exit=1", BENCH)
        cb = login(*srun, "commbench", "launcher=slurm", "kinds=[all_reduce,all_reduce_hier]", f"sizes=[{size}]",
                   "iters=5", f"out={out / 'commbench'}")
        if cb.returncode:
            raise SystemExit(f"commbench failed: {cb.stderr[-1500:]}")
        run = login(*srun, "run", "launcher=slurm", "framework=ddp", "model=gpt2_tiny", "debug=fast",
                    f"launcher.nproc={NODES * DEVICES}", "run.measure_steps=10", f"run.dir={out / 'run'}",
                    "run.timeout_s=300")
        if run.returncode:
            raise SystemExit(f"the DDP run failed: {run.stdout[-800:]} {run.stderr[-1500:]}")
    finally:
        cluster("down", f"name={NAME}")
    rows = json.loads((out / "commbench" / "commbench.json").read_text())["rows"]
    rec = json.loads((out / "run" / "result.json").read_text())
    return {"flat_s": next(r["time_s"] for r in rows if r["kind"] == "all_reduce"),
            "hier_s": next(r["time_s"] for r in rows if r["kind"] == "all_reduce_hier"),
            "step_s": rec["timing"]["window_step_s"], "step_p10_s": rec["timing"]["step_time_s"]["p10"],
            "step_p90_s": rec["timing"]["step_time_s"]["p90"], "record": str(out / "run" / "result.json")}


def predict(network, work, compute_s: float, dev_mbit: float, share_mbit: float, size: int) -> dict:
    from ddlbench.network.model import GLOO, collective_time, hierarchical, layout
    from ddlbench.network.project import exposed_time
    net = network.with_bandwidths([dev_mbit * 1e6 / 8, share_mbit * 1e6 / 8])
    spans = list(zip(layout(net, NODES * DEVICES), net.dims))
    return {"flat_s": collective_time("all_reduce", size, spans, GLOO)[0],
            # commbench's hierarchical all-reduce is made of gloo's collectives
            "hier_s": hierarchical("all_reduce", size, spans, gloo=True),
            "step_s": compute_s + exposed_time(work, net, NODES * DEVICES, GLOO, measured_groups=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--total-mbit", type=float, default=300.0, help="per-device budget: dev_link + uplink share")
    ap.add_argument("--fractions", default=",".join(f"{f:.4f}" for f in FRACTIONS),
                    help="the budget's fraction on the device link, one split each")
    a = ap.parse_args()
    from ddlbench.network.allocate import allocate
    from ddlbench.network.model import GLOO, from_dict
    from ddlbench.network.project import compute_seconds
    from ddlbench.network.workload import from_record

    fractions = [float(f) for f in a.fractions.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    rows, work, network, compute_s, size = [], None, None, None, None
    for f in fractions:
        dev, link = split_rates(a.total_mbit, f)
        if size is None:       # the DDP step's gradient all-reduce: the parameters in fp32
            import torch

            from ddlbench.config import plan_from_overrides
            from ddlbench.models.registry import build
            from ddlbench.models.spec import count_params
            with torch.device("meta"):
                size = 4 * count_params(build(plan_from_overrides(["model=gpt2_tiny"]).cfg.model, "cpu").factory())
        got = measure(a.out / f"split-{f:.3f}", dev, link, size)
        rec = json.loads(Path(got["record"]).read_text())
        if work is None:       # compute from the first split's run: its step less the modelled exposed comm
            network = from_dict(rec["env"]["network"]["description"])
            work = from_record(rec)
            compute_s = compute_seconds(work, measured_on=network, algorithm=GLOO)[0]
        pred = predict(network, work, compute_s, dev, link / DEVICES, size)
        row = {"fraction": f, "dev_link_mbit": dev, "link_mbit": link, "measured": got, "predicted": pred}
        rows.append(row)
        print(f"dev {dev:7.1f} link {link:7.1f} Mbit/s | flat {got['flat_s'] * 1e3:7.1f} ms (model "
              f"{pred['flat_s'] / got['flat_s']:.2f}x) | hier {got['hier_s'] * 1e3:7.1f} ms (model "
              f"{pred['hier_s'] / got['hier_s']:.2f}x) | step {got['step_s'] * 1e3:7.1f} ms (model "
              f"{pred['step_s'] / got['step_s']:.2f}x)", flush=True)
    best = min(rows, key=lambda r: r["measured"]["step_s"])
    chosen = allocate(work, network, NODES * DEVICES, compute_s, objective="time",
                      budget_GBps=a.total_mbit * 1e6 / 8 / 1e9, min_GBps=1e-4, algorithm=GLOO)
    chosen_dev_mbit = chosen["bandwidth_GBps"][0] * 8e3
    nearest = min(rows, key=lambda r: abs(r["dev_link_mbit"] - chosen_dev_mbit))
    within = nearest["measured"]["step_s"] <= best["measured"]["step_p90_s"]
    summary = {"total_mbit": a.total_mbit, "size_bytes": size, "compute_s": compute_s, "rows": rows,
               "measured_best": {"dev_link_mbit": best["dev_link_mbit"], "step_s": best["measured"]["step_s"]},
               "model_choice": {"dev_link_mbit": chosen_dev_mbit, "step_s": chosen["step_s"],
                                "nearest_measured_split": nearest["dev_link_mbit"],
                                "its_measured_step_s": nearest["measured"]["step_s"],
                                "within_the_best_splits_p90": within}}
    (a.out / "bandwidth_split.json").write_text(json.dumps(summary, indent=1))
    print(f"measured fastest step: dev_link {best['dev_link_mbit']:.1f} Mbit/s ({best['measured']['step_s'] * 1e3:.1f} ms); "
          f"the model's choice: dev_link {chosen_dev_mbit:.1f} Mbit/s, measured at the nearest split "
          f"{nearest['measured']['step_s'] * 1e3:.1f} ms: {'within' if within else 'outside'} the fastest split's "
          f"p90 step ({best['measured']['step_p90_s'] * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
