"""`bench project RESULT network=NAME [key=value ...]`: the measured run projected to other world
sizes on a modelled network; with allocate=..., the per-dimension bandwidth split."""
from __future__ import annotations

import csv
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.record.results import atomic_write_json

DEFAULT_WORLD_SIZES = [8, 64, 512, 4096, 32768, 100000]
KEYS = {"network", "world_sizes", "scaling", "overlap", "algorithm", "measured_on", "compute_from", "out", "replace",
        "allocate", "budget_GBps", "budget_cost", "devices", "min_GBps", "max_GBps", "device_cost", "mttf"}


USAGE = ("usage: bench project RESULT network=NAME [world_sizes=[8,64,...]] [scaling=weak|strong] "
         "[overlap=0..1] [algorithm=auto|best|ring|tree|hierarchical|gloo] [measured_on=NETWORK] "
         "[compute_from=RESULT_1_RANK] [allocate=time|perf_per_cost budget_GBps=X|budget_cost=Y] [device_cost=Z] "
         "[mttf=DEVICES:HOURS,DEVICES:HOURS] [out=DIR] [replace=true]")


def parse(args: list[str]):
    """(RESULT, the options as KeyValues)."""
    from ddlbench.settings.keyvalue import parse_key_values
    kv = parse_key_values(args, "bench project", KEYS, positional=True, required=("network",), usage=USAGE)
    if len(kv.positional) != 1:
        raise ConfigError(USAGE)
    from ddlbench.project.spec_command import world_sizes
    sizes = world_sizes(kv, DEFAULT_WORLD_SIZES)
    numbers(kv, sizes)          # every number checked before anything is read
    return Path(kv.positional[0]), kv, sizes


def numbers(kv, sizes: list[int]) -> dict:
    """The numeric options, finite and in range (ConfigError naming the key and the range)."""
    return {"overlap": kv.number("overlap", 0.0, low=0.0, high=1.0),
            "devices": kv.integer("devices", sizes[-1]),
            "budget_GBps": kv.number("budget_GBps", positive=True),
            "budget_cost": kv.number("budget_cost", positive=True),
            "min_GBps": kv.number("min_GBps", 0.1, positive=True),
            "max_GBps": kv.number("max_GBps", positive=True),
            "device_cost": kv.number("device_cost", 0.0, low=0.0)}


def compute_from_mismatch(rec: dict, single: dict) -> list[str]:
    """What makes `single` unfit to give `rec`'s compute time (issue 66: a llama_tiny step priced a
    gpt2_tiny projection): it must be one rank, of the same model (shape), precision and sequence."""
    def model(r):
        m = r.get("model") or {}
        return m.get("name"), m.get("params")

    def seq(r):
        return ((r.get("config") or {}).get("model") or {}).get("seq_len")
    out = []
    world = (single.get("parallel") or {}).get("world_size")
    if world != 1:
        out.append(f"it ran on {world} ranks")
    if model(single) != model(rec):
        out.append(f"its model is {model(single)[0]} ({model(single)[1]} parameters), the run's "
                   f"{model(rec)[0]} ({model(rec)[1]})")
    if single.get("precision") != rec.get("precision"):
        out.append(f"its precision is {single.get('precision')}, the run's {rec.get('precision')}")
    if seq(single) != seq(rec):
        out.append(f"its sequence is {seq(single)} tokens, the run's {seq(rec)}")
    if single.get("status") != "ok":
        out.append(f"its status is {single.get('status')}")
    return out




def _record(path: Path) -> dict:
    from ddlbench.record.results import load_result
    from ddlbench.record.rundir import RunDir
    p = RunDir(path).result if path.is_dir() else path
    if not p.is_file():
        raise ConfigError(f"no {p.name} at {path}")
    return load_result(p)


def run(args: list[str]) -> int:
    from ddlbench.network import model
    from ddlbench.project import projection as proj
    from ddlbench.project import spec_command, workload
    if any(a.startswith("published=") for a in args):     # a published table, every row predicted
        from ddlbench.project.published import run as published
        return published(args)
    if spec_command.is_spec(args):          # no RESULT: a layout from its specification
        return spec_command.run(args)
    path, o, sizes = parse(args)
    rec = _record(path)
    par = rec.get("parallel") or {}
    if any((par.get(k) or 1) > 1 for k in ("tp", "pp", "cp")):     # a model-parallel layout: its schedule
        return spec_command.project_record(rec, path, o, sizes)
    work = workload.from_record(rec)
    net = model.for_world_sizes(o.text("network"), sizes)
    algorithm = o.text("algorithm", "auto")
    if algorithm not in ("auto", "best", *model.ALGORITHMS, model.GLOO):
        raise ConfigError(f"algorithm must be auto, best, ring, tree, hierarchical or gloo, got {algorithm!r}")
    scaling = o.choice("scaling", ("weak", "strong"), "weak")
    num = numbers(o, sizes)
    overlap = num["overlap"]
    compute_from = None
    if o.text("compute_from"):
        single = _record(Path(o.text("compute_from")))
        wrong = compute_from_mismatch(rec, single)
        if wrong:
            raise ConfigError(f"compute_from={o.text('compute_from')} is not a 1-rank result of this run's configuration: "
                              + "; ".join(wrong))
        compute_from = workload.from_record(single)
    out = spec_command.claim_out(Path(o.text("out") or ((path if path.is_dir() else path.parent) / f"projection_{net.name}")), o)
    replanned = None
    if work.world == 1 and not work.collectives:      # a 1-rank run sent nothing: re-plan, never price zero
        work, replanned = workload.replanned(rec, work)
    backend = (rec.get("env") or {}).get("backend")
    if algorithm == "auto":     # the algorithm the run's backend runs (gloo: flat rings, reduce-scatter as all-reduce)
        algorithm = model.backend_algorithm(backend)
    recorded = model.recorded_network(rec)      # inside `bench cluster`: the link it ran on
    measured_on = model.load(o.text("measured_on")) if o.text("measured_on") else recorded or model.load("local_gloo")
    if compute_from is not None or work.world == 1:
        measured_on = None
    if backend == "nccl" and not o.text("measured_on") and recorded is None and compute_from is None and work.world > 1:
        raise ConfigError("a GPU (nccl) result needs measured_on=<the network it ran on> or compute_from=<1-rank result>")
    compute_s, compute_src = proj.compute_seconds(work, measured_on, compute_from, algorithm)
    rows = proj.project(work, net, sizes, compute_s, scaling, algorithm, overlap)
    doc = {"run_id": rec.get("run_id"), "strategy": work.label, "network": net.name, "network_file": net.source,
           "scaling": scaling, "overlap": overlap, "algorithm": algorithm,
           "compute_s": compute_s, "compute_source": compute_src, "measured_step_s": work.step_s,
           "measured_world": work.world,
           "collectives": [{"kind": c.kind, "bytes_per_step": c.bytes, "scope": c.scope, "measured_group": c.ranks}
                           for c in work.collectives],
           "collectives_source": replanned or "measured (the run's probe step)",
           "rows": rows}
    from ddlbench.project import goodput
    kept = goodput.table(rec, rows, goodput.mttf_points(o.text("mttf")))    # a run that saved checkpoints
    if kept is not None:
        doc["goodput"] = kept
    if o.text("allocate"):
        from ddlbench.project.allocate import allocate
        try:
            doc["allocation"] = allocate(work, net, num["devices"], compute_s, o.text("allocate"), num["budget_GBps"],
                                         num["budget_cost"], num["min_GBps"], num["max_GBps"],
                                         device_cost=num["device_cost"])
        except ValueError as exc:
            raise ConfigError(f"allocate: {exc}") from None
    atomic_write_json(out / "projection.json", doc)    # strict JSON: a non-finite number is null
    with open(out / "projection.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["devices", "global_batch", "compute_s", "comm_s", "step_s", "samples_per_s", "comm_share",
                    "scaling_efficiency", "exposed_comm_s"])
        for r in rows:
            w.writerow([r["devices"], r["global_batch"], r["compute_s"], r["comm_s"], r["step_s"], r["samples_per_s"],
                        r["comm_share"], r["scaling_efficiency"], r["exposed_comm_s"]])
    plot = _plot(rows, out / "projection.png", f"{work.label} on {net.name} ({scaling} scaling)")
    _print(doc, out, plot)
    return 0


def _plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = [r["devices"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.loglog(n, [r["samples_per_s"] for r in rows], "o-", label="projected")
    a.loglog(n, [r["devices"] * r["per_device_batch"] / r["compute_s"] for r in rows], "--", label="linear (no comm)")
    a.set_xlabel("devices"), a.set_ylabel("samples/s"), a.legend(), a.grid(True, which="both", alpha=.3)
    b.semilogx(n, [r["scaling_efficiency"] for r in rows], "o-", label="scaling efficiency")
    b.semilogx(n, [r["comm_share"] for r in rows], "s--", label="communication share of the step")
    b.set_ylim(0, 1.05), b.set_xlabel("devices"), b.legend(), b.grid(True, which="both", alpha=.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _print(doc: dict, out: Path, plot: Path) -> None:
    from ddlbench.record.table import text_table
    print(f"{doc['strategy']} on {doc['network']}, {doc['scaling']} scaling, overlap {doc['overlap']}, "
          f"compute {doc['compute_s'] * 1e3:.2f} ms/step ({doc['compute_source']})")
    print(f"collectives: {doc['collectives_source']}: "
          + ", ".join(f"{c['kind']} {c['bytes_per_step'] / 2**20:.2f} MiB/step over {c['scope']}" for c in doc["collectives"]))
    print(text_table(["devices", "layout", "global batch", "step ms", "comm ms", "exposed ms", "samples/s",
                      "comm share", "efficiency"], [[str(r["devices"]), "x".join(map(str, r["layout"])),
                     f"{r['global_batch']:.0f}", f"{r['step_s'] * 1e3:.2f}", f"{r['comm_s'] * 1e3:.2f}",
                     f"{r['exposed_comm_s'] * 1e3:.2f}", f"{r['samples_per_s']:,.0f}",
                     f"{r['comm_share']:.0%}", f"{r['scaling_efficiency']:.0%}"] for r in doc["rows"]]))
    if "allocation" in doc:
        a = doc["allocation"]
        print(f"allocation ({a['objective']}, {a['devices']} devices, {a['algorithm']}): "
              + ", ".join(f"{d} {b:.2f} GB/s (now {c:.2f})" for d, b, c in zip(a["dimensions"], a["bandwidth_GBps"], a["current_GBps"]))
              + f"; step {a['step_s'] * 1e3:.2f} ms (now {a['step_s_current'] * 1e3:.2f}), cost {a['cost']:.1f} (now {a['cost_current']:.1f})")
    if "goodput" in doc:
        from ddlbench.project.goodput import lines
        print("\n".join(lines(doc["goodput"])))
    for name in ("projection.json", "projection.csv"):
        print(f"  {out / name}")
    print(f"  {plot}")
