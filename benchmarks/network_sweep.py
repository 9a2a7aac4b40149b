"""What only a network shows: frameworks across two emulated nodes (`bench cluster`) at several
inter-node link rates, the projection model held against each, and the communication-reducing
strategies against DDP on the slowest link, time to target included.

    .venv/bin/python benchmarks/network_sweep.py OUT_DIR [--rates 10gbit,1gbit,100mbit] [--resume]
        [--frameworks ddp,fsdp_full,deepspeed_zero2,horovod] [--skip-quality] [--repeats 3] [--gap-ms 50]
        [--no-per-world-fits] [--fit-statistic time_s|mean_time_s] [--base RATE]

Root only (network namespaces; see docs/cluster.md). For each rate: `bench cluster up nodes=2
link=RATE`; `bench commbench launcher=slurm` across the two nodes, each op after 50 ms idle, at 2
and at 4 ranks (α-β fits -> a fitted network);
each framework at 2 nodes x 1 and x 2 ranks under `srun` (gpt2_tiny, per-rank batch 8), --repeats
runs each (the median run stands for the point: run-to-run noise here is 5-10%); its step time
predicted from a 1-rank run of the same configuration on one node (its compute) plus its own
collectives priced on (a) the link rate as configured and (b) commbench's fit; on the slowest
rate, experiment=seed_language_tiny for DDP, DASO (one rank per node), post-local SGD, PowerSGD
and the fp16 hook. Then `bench cluster down` and `bench report` over every run. Writes
OUT_DIR/network_sweep.{json,md}, throughput_vs_link.png and report/; prints the tables.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from runs import reuse

REPO = Path(__file__).resolve().parents[1]
BENCH = str(Path(sys.executable).parent / "bench")
NAME = "netsweep"
FRAMEWORKS = ["ddp", "fsdp_full", "deepspeed_zero2", "horovod"]
STRATEGIES = {"ddp": ["framework=ddp"], "daso": ["framework=daso", "framework.options.ranks_per_node=1"],
              "ddp:local_sgd": ["framework=ddp_local_sgd"], "ddp:powersgd": ["framework=ddp_powersgd"],
              "ddp:fp16_hook": ["framework=ddp_fp16_hook"]}
PER_RANK_BATCH = 8
PER_NODE = (1, 2)        # ranks per node: 2 and 4 ranks on the 2 nodes
STEPS = ["model=gpt2_tiny", "run.warmup_steps=3", "run.measure_steps=15", "run.progress=false", "logger=none"]


@dataclass(frozen=True)
class Settings:
    """The sweep's settings (the command line), one object handed to every step."""
    resume: bool = False           # --resume: read back results already in OUT_DIR
    repeats: int = 3               # runs per point; the median run stands for it
    # --gap-ms: commbench sleeps this long before each timed op (a run's collectives come after ~50 ms
    # of compute, and on the shaped links a message after idle crosses at a different speed than back
    # to back: 100 Mbit/s, 1 MiB all-reduce 13.5 MB/s after 50 ms idle, 12.1 back to back); with
    # per_world_fits (commbench at 4 ranks, 2 a node, too) the defaults: reports/network/README.md
    # has the four combinations measured on the same runs (fit_variants/)
    gap_ms: float = 50.0
    per_world_fits: bool = True
    # what commbench's fits are drawn through, per size: time_s (the slowest rank's median over the
    # iterations) or mean_time_s (its mean: a step of many ops pays the mean)
    fit_statistic: str = "time_s"
    reused: Counter = field(default_factory=Counter, compare=False)   # runs read back (--resume)


def cluster(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, "cluster", *args], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


def login(*cmd: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return cluster("exec", f"name={NAME}", "--", *cmd, timeout=timeout)


TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPLossProbes", "TcpExtTCPTimeouts")


def steal_s() -> float:
    """Seconds the hypervisor took from this machine's CPUs (/proc/stat steal, all CPUs)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def tcp_counters(nodes: int) -> dict:
    """Each node's TCP retransmission counters (its network namespace's /proc/net), absolute."""
    proc = login("srun", f"-N{nodes}", "--ntasks-per-node=1", "bash", "-c",
                 f"echo $(hostname) $(nstat -asz {' '.join(TCP_COUNTERS)} | awk '/^[A-Z]/{{print $1\"=\"$2}}')", timeout=120)
    out = {}
    for line in proc.stdout.splitlines():
        host, *pairs = line.split()
        out[host] = {k: int(v) for k, v in (p.split("=") for p in pairs)}
    return out


def srun_bench(s: Settings, run_dir: Path, nodes: int, *overrides: str, per_node: int = 1) -> dict:
    """`bench run launcher=slurm` as an srun step of `nodes` nodes x `per_node` tasks inside the
    cluster (more tasks than a node's cores: --overcommit, the node's ranks share its core).
    Beside the record (run_dir/network_diag.json): the CPU time the hypervisor stole meanwhile
    and each node's TCP retransmissions, to tell a stall of the machine from one of the links."""
    if reuse(run_dir, s.resume):
        s.reused["runs"] += 1
    else:
        before, stolen = tcp_counters(nodes), steal_s()
        login("srun", f"-N{nodes}", f"-n{nodes * per_node}", "--overcommit", "--kill-on-bad-exit=1", BENCH, "run",
              "launcher=slurm", f"run.dir={run_dir}", "run.timeout_s=900", *overrides)
        stolen, after = steal_s() - stolen, tcp_counters(nodes)
        diag = {"steal_s": stolen, "tcp": {h: {k: v - before.get(h, {}).get(k, 0) for k, v in c.items()}
                                           for h, c in after.items()}}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "network_diag.json").write_text(json.dumps(diag))
    path = run_dir / "result.json"
    rec = json.loads(path.read_text()) if path.exists() else {"status": "no result", "error": {"message": str(run_dir)}}
    rec["_dir"] = str(run_dir)
    diag_path = run_dir / "network_diag.json"
    rec["_diag"] = json.loads(diag_path.read_text()) if diag_path.exists() else None
    return rec


def step_s(rec: dict) -> float:
    return rec["timing"]["step_time_s"]["median"]


def repeated(s: Settings, run_dir: Path, nodes: int, *overrides: str, per_node: int = 1) -> dict:
    """s.repeats runs of one configuration (run_dir/rep<k>), each a fresh srun step; the run whose
    median step time is the median of the repeats' stands for the point (its record prices the
    point's collectives), with every repeat's step time beside it."""
    recs = [srun_bench(s, run_dir / f"rep{k}", nodes, *overrides, per_node=per_node) for k in range(s.repeats)]
    ok = sorted((r for r in recs if r["status"] == "ok"), key=step_s)
    if len(ok) < len(recs):
        return next(r for r in recs if r["status"] != "ok")
    median = ok[(len(ok) - 1) // 2]
    median["_repeat_steps_s"] = [step_s(r) for r in recs]
    median["_repeat_diag"] = [r.get("_diag") for r in recs]
    return median


def _commbench(s: Settings, out: Path, per_node: int) -> dict:
    if not (s.resume and (out / "commbench.json").exists()):
        proc = login("srun", "-N2", f"-n{2 * per_node}", "--overcommit", BENCH, "commbench",
                     "launcher=slurm", "sizes=[262144,1048576,4194304]", "iters=20", "warmup=2",
                     f"gap_ms={s.gap_ms}", f"out={out}")
        if proc.returncode != 0:
            raise SystemExit(f"commbench failed: {proc.stderr[-2000:]}")
    return json.loads((out / "commbench.json").read_text())


def commbench(s: Settings, out: Path, rate: str) -> dict:
    """commbench across the two nodes at 2 ranks (one a node: out) and, with --per-world-fits, at 4
    (two a node, sharing its core and link: out + '_x4'); the fitted network (out/network.yaml)
    prices the link by the 2-rank all-reduce fit, every kind by its own, and a 4-rank collective
    by the 4-rank fits where measured."""
    record = _commbench(s, out, 1)
    # the fitted network from the measurements, by this code's fit (a resumed sweep's earlier
    # network.yaml may predate per-kind fits): the cluster's description, the link priced by
    # the all-reduce fit, every other kind by its own
    import yaml

    from ddlbench.cluster.plan import make_plan, network_description
    from ddlbench.network.fit import add_world_fits, fits, fitted_network
    base = network_description(make_plan(2, rate, [0, 1], "-", NAME))
    record["fits"] = fits(record["rows"], record["world_size"], record["backend"], s.fit_statistic)
    fit = next(f for f in record["fits"] if f["kind"] == "all_reduce")
    network = fitted_network(base, fit, 2, record["fits"])
    if s.per_world_fits:
        four = _commbench(s, out.with_name(out.name + "_x4"), 2)
        record["fits_x4"] = fits(four["rows"], four["world_size"], four["backend"], s.fit_statistic)
        network = add_world_fits(network, record["fits_x4"], four["world_size"], "link")
    (out / "network.yaml").write_text(yaml.safe_dump(network, sort_keys=False))
    return record


def predictions(rec: dict, one: dict, fitted_path: Path) -> dict:
    from ddlbench.network.model import load, recorded_network
    from ddlbench.project.validate import predict
    out = {}
    nets = {"configured": recorded_network(rec), "fitted": load(str(fitted_path))}
    for label, net in nets.items():
        try:
            out[label] = predict(rec, one, net)
        except Exception as exc:       # a result the model cannot price: said, not hidden
            out[label] = {"error": str(exc)}
    return out


def cross_rate(out: Path, doc: dict, base: str) -> None:
    """`bench project`'s own path, held against each link: compute = the step measured at `base`
    minus its exposed collectives modelled at `base` (multi-rank overheads stay in), plus the base
    run's collectives (and issue profile, where it has one) exposed at each other rate; on the
    configured and on the fitted networks. Only the base run is read for a prediction; beside it,
    `repeat_range`: the least and greatest error over every pairing of a base repeat (its own
    prediction) with a target repeat (its step), the spread the runs' own noise puts on the error."""
    from ddlbench.network.model import backend_algorithm, load, recorded_network
    from ddlbench.project.projection import compute_seconds, exposed_time
    from ddlbench.project.workload import from_record
    def key(p):
        return p["rate"], p["framework"], p.get("ranks", 2)

    recs = {key(p): dict(json.loads((Path(p["run_dir"]) / "result.json").read_text()), _dir=p["run_dir"])
            for p in doc["points"] if p["status"] == "ok"}
    for p in doc["points"]:
        at_base = (base, p["framework"], p.get("ranks", 2))
        if at_base not in recs or key(p) not in recs:
            continue
        p["from_base"] = {"base": base}
        alg = backend_algorithm(recs[key(p)]["env"].get("backend"))     # gloo: flat rings
        measured = from_record(recs[key(p)]).step_s
        base_repeats = [from_record(r) for r in repeats(recs[at_base]["_dir"])]
        for label in ("configured", "fitted"):
            def net(rate, p=p, label=label):
                rec = recs[(rate, p["framework"], p.get("ranks", 2))]
                return (recorded_network(rec) if label == "configured"
                        else load(str(out / rate / "commbench" / "network.yaml")))
            at, to = net(base), net(p["rate"])

            def predict(work, at=at, to=to, alg=alg):
                compute, _ = compute_seconds(work, measured_on=at, algorithm=alg)
                return compute + exposed_time(work, to, work.world, alg, measured_groups=True)
            one = predict(from_record(recs[at_base]))
            predicted = [predict(w) for w in base_repeats]
            errs = [(x - m) / m for x in predicted for m in p.get("repeat_steps_s") or [measured]]
            # pooled: the median of the base repeats' predictions (each its own compute), not the
            # median run's alone
            pooled = statistics.median(predicted)
            p["from_base"][label] = {"predicted_step_s": one, "relative_error": (one - measured) / measured,
                                     "repeat_range": [min(errs), max(errs)],
                                     "pooled": {"predicted_step_s": pooled,
                                                "relative_error": (pooled - measured) / measured}}


def repeats(run_dir: str) -> list[dict]:
    """The ok records of every repeat beside run_dir (its siblings rep0, rep1, ...)."""
    recs = [json.loads(f.read_text()) for f in sorted(Path(run_dir).parent.glob("rep*/result.json"))]
    return [r for r in recs if r.get("status") == "ok"]


def up(rate: str) -> None:
    cluster("down", f"name={NAME}")
    proc = cluster("up", "nodes=2", f"link={rate}", f"name={NAME}")
    if proc.returncode != 0:
        raise SystemExit(f"bench cluster up failed: {proc.stderr[-2000:]}")


def sweep(s: Settings, out: Path, rates: list[str], frameworks: list[str], quality: bool) -> dict:
    doc = {"rates": rates, "frameworks": frameworks, "points": [], "quality": [], "commbench": {},
           "fit_statistic": s.fit_statistic}
    singles: dict[str, dict] = {}
    for rate in rates:
        up(rate)
        try:
            t0 = time.monotonic()
            cb = commbench(s, out / rate / "commbench", rate)
            fit = next(f for f in cb["fits"] if f["kind"] == "all_reduce")
            doc["commbench"][rate] = {"hosts": cb["hosts"], "all_reduce_fit": fit, "gap_ms": cb.get("gap_ms", 0.0),
                                      "all_reduce_fit_x4": next((f for f in cb.get("fits_x4", [])
                                                                 if f["kind"] == "all_reduce"), None)}
            for fw in frameworks:
                if fw not in singles:     # compute does not depend on the link: 1-rank runs once
                    singles[fw] = repeated(s, out / "one_rank" / fw, 1, f"framework={fw}", *STEPS,
                                           f"run.global_batch={PER_RANK_BATCH}")
                for per_node in PER_NODE:
                    ranks = 2 * per_node
                    rec = repeated(s, out / rate / (fw if per_node == 1 else f"{fw}_x{ranks}"), 2, f"framework={fw}",
                                   *STEPS, f"run.global_batch={ranks * PER_RANK_BATCH}", per_node=per_node)
                    point = {"rate": rate, "framework": fw, "ranks": ranks, "status": rec["status"],
                             "error": (rec.get("error") or {}).get("message"), "run_dir": rec["_dir"]}
                    if rec["status"] == "ok" and singles[fw]["status"] == "ok":
                        point.update(samples_per_s=rec["throughput"]["samples_per_s"],
                                     step_s=step_s(rec), repeat_steps_s=rec["_repeat_steps_s"],
                                     hosts=rec["env"]["rank_hosts"], repeat_diag=rec["_repeat_diag"],
                                     wire_bytes_per_rank=rec["comm"]["wire_bytes_per_rank"],
                                     one_rank_step_s=step_s(singles[fw]),
                                     predicted=predictions(rec, singles[fw], out / rate / "commbench" / "network.yaml"))
                    doc["points"].append(point)
            if quality and rate == rates[-1]:
                for label, ov in STRATEGIES.items():
                    rec = srun_bench(s, out / rate / "quality" / label.replace(":", "_"), 2,
                                     "experiment=seed_language_tiny", "run.progress=false", "logger=none", *ov)
                    conv = rec.get("convergence") or {}
                    doc["quality"].append({"rate": rate, "strategy": label, "status": rec["status"],
                                           "time_to_target_s": conv.get("time_to_target_s"),
                                           "steps_to_target": conv.get("steps_to_target"),
                                           "samples_per_s": (rec.get("throughput") or {}).get("samples_per_s"),
                                           "wire_bytes_per_rank": (rec.get("comm") or {}).get("wire_bytes_per_rank")})
            doc["commbench"][rate]["wall_s"] = time.monotonic() - t0
        finally:
            cluster("down", f"name={NAME}")
    return doc


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _diag(d: dict | None) -> str:
    if not d:
        return "-"
    return f"{sum(c.get('TcpRetransSegs', 0) for c in d['tcp'].values())}, {d['steal_s']:.1f}"


def markdown(doc: dict) -> str:
    base = next((p["from_base"]["base"] for p in doc["points"] if p.get("from_base")), "-")
    lines = ["Step time predicted two ways: (a) compute from a 1-rank run on one node (bench report's projection "
             f"check), (b) compute from the run at {base} less its modelled collectives (`bench project`'s "
             "measured_on path; in brackets the least and greatest error over every pairing of a base "
             "repeat with a repeat of the point: the runs' own noise); collectives priced on the link as "
             "configured / on commbench's fit "
             f"(through each size's {'mean' if doc.get('fit_statistic') == 'mean_time_s' else 'median'} time).", "",
             "| link | framework | ranks | status | samples/s | step (ms) | repeats (ms) "
             "| repeats: TCP retransmits, CPU steal (s) | 1-rank step (ms) | wire/rank/step (KiB) "
             "| (a) configured (ms) | error | (a) fitted (ms) | error "
             f"| (b) from {base}, configured (ms) | error | (b) fitted (ms) | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in doc["points"]:
        cells = []
        for pr in (p.get("predicted") or {}, p.get("from_base") or {}):
            for key in ("configured", "fitted"):
                q = pr.get(key) or {}
                spread = (f" [{q['repeat_range'][0]:+.1%}, {q['repeat_range'][1]:+.1%}]"
                          if q.get("repeat_range") else "")
                cells += ([_f(q["predicted_step_s"] * 1e3, ".1f"), f"{q['relative_error']:+.1%}{spread}"]
                          if "predicted_step_s" in q else [q.get("error", "-"), "-"])
        lines.append(f"| {p['rate']} | {p['framework']} | {p.get('ranks', 2)} | {p['status']} | "
                     f"{_f(p.get('samples_per_s'), '.1f')} | "
                     f"{_f(p.get('step_s') and p['step_s'] * 1e3, '.1f')} | "
                     f"{'/'.join(f'{x * 1e3:.1f}' for x in p.get('repeat_steps_s') or []) or '-'} | "
                     f"{' / '.join(_diag(d) for d in p.get('repeat_diag') or []) or '-'} | "
                     f"{_f(p.get('one_rank_step_s') and p['one_rank_step_s'] * 1e3, '.1f')} | "
                     f"{_f(p.get('wire_bytes_per_rank') and p['wire_bytes_per_rank'] / 1024, '.0f')} | " + " | ".join(cells) + " |")
    lines += ["", "| link | commbench all-reduce fit: bandwidth (MB/s) | of the link rate | alpha (us) "
              "| idle gap before each op (ms) | 4-rank fit (MB/s, alpha us) |", "|---|---|---|---|---|---|"]
    from ddlbench.cluster.plan import rate_bits
    for rate, cb in doc["commbench"].items():
        f, f4 = cb["all_reduce_fit"], cb.get("all_reduce_fit_x4")
        x4 = (f"{f4['bandwidth_Bps'] / 1e6:.1f}, {f4['alpha_s'] * 1e6:.0f}" if f4 and "bandwidth_Bps" in f4 else "-")
        lines.append(f"| {rate} | {f['bandwidth_Bps'] / 1e6:.1f} | {f['bandwidth_Bps'] * 8 / rate_bits(rate):.1%} | "
                     f"{f['alpha_s'] * 1e6:.0f} | {cb.get('gap_ms', 0.0):g} | {x4} |")
    if doc["quality"]:
        ref = next((q for q in doc["quality"] if q["strategy"] == "ddp"), {})
        lines += ["", f"Time to target on the slowest link ({doc['quality'][0]['rate']}), experiment=seed_language_tiny, "
                  "2 nodes x 1 rank:", "",
                  "| strategy | status | time to target (s) | vs DDP | steps to target | samples/s | wire/rank/step (KiB) |",
                  "|---|---|---|---|---|---|---|"]
        for q in doc["quality"]:
            rel = (q["time_to_target_s"] / ref["time_to_target_s"]
                   if q.get("time_to_target_s") and ref.get("time_to_target_s") else None)
            reached = q["status"] != "ok" or q.get("time_to_target_s") is not None
            lines.append(f"| {q['strategy']} | {q['status']} | "
                         f"{_f(q['time_to_target_s'], '.1f') if reached else 'not reached'} | {_f(rel, '.2f')} | "
                         f"{_f(q['steps_to_target'], 'd')} | {_f(q['samples_per_s'], '.1f')} | "
                         f"{_f(q['wire_bytes_per_rank'] and q['wire_bytes_per_rank'] / 1024, '.0f')} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddlbench.cluster.plan import rate_bits
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for i, fw in enumerate(doc["frameworks"]):
        for ranks, style in ((2, "-"), (4, "--")):
            pts = sorted((rate_bits(p["rate"]) / 1e9, p["samples_per_s"]) for p in doc["points"]
                         if p["framework"] == fw and p.get("ranks", 2) == ranks and p.get("samples_per_s"))
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", color=f"C{i}",
                        label=f"{fw} ({ranks} ranks)")
    ax.set_xscale("log")
    ax.set_xlabel("inter-node link (Gbit/s, tbf)")
    ax.set_ylabel("samples/s (2 nodes x 1 or 2 ranks)")
    ax.set_title("Throughput against link rate, gpt2_tiny, bench cluster")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rates", default="10gbit,1gbit,100mbit")
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--base", help="the rate whose runs give (b)'s compute (default: the second rate, "
                                   "else the first: the fastest link can be the machine's, not the shaper's)")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--resume", action="store_true", help="read back results already in OUT_DIR")
    d = Settings()
    ap.add_argument("--repeats", type=int, default=d.repeats, help="runs per point (the median run stands for it)")
    ap.add_argument("--gap-ms", type=float, default=d.gap_ms, help="commbench's idle gap before each timed op")
    ap.add_argument("--per-world-fits", action=argparse.BooleanOptionalAction, default=d.per_world_fits,
                    help="commbench at 4 ranks (2 a node) too; 4-rank collectives priced by those fits")
    ap.add_argument("--fit-statistic", choices=("time_s", "mean_time_s"), default=d.fit_statistic,
                    help="commbench's fits through each size's median time (time_s) or mean time")
    args = ap.parse_args()
    s = Settings(resume=args.resume, repeats=args.repeats, gap_ms=args.gap_ms, per_world_fits=args.per_world_fits,
                 fit_statistic=args.fit_statistic)
    out = args.out.resolve()
    rates = args.rates.split(",")
    doc = sweep(s, out, rates, args.frameworks.split(","), not args.skip_quality)
    cross_rate(out, doc, args.base or rates[min(1, len(rates) - 1)])
    (out / "network_sweep.json").write_text(json.dumps(doc, indent=1))
    text = markdown(doc)
    (out / "network_sweep.md").write_text(text)
    plot(doc, out / "throughput_vs_link.png")
    subprocess.run([BENCH, "report", str(out), "-o", str(out / "report")], cwd=REPO, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=900)
    print(text)
    for way, key in (("(a) from 1-rank compute", "predicted"), ("(b) from the base rate's run", "from_base")):
        errs = [abs(q["relative_error"]) for p in doc["points"] for q in (p.get(key) or {}).values()
                if isinstance(q, dict) and "relative_error" in q and p["rate"] != (p.get("from_base") or {}).get("base")]
        if errs:
            print(f"projection |error| {way}: mean {sum(errs) / len(errs):.1%}, max {max(errs):.1%} "
                  f"over {len(errs)} predictions")
    for label in ("configured", "fitted"):
        qs = [p["from_base"][label] for p in doc["points"] if p["rate"] != (p.get("from_base") or {}).get("base")
              and "repeat_range" in (p.get("from_base") or {}).get(label, {})]
        if qs:
            within = sum(abs(q["relative_error"]) <= 0.10 for q in qs)
            always = sum(max(map(abs, q["repeat_range"])) <= 0.10 for q in qs)
            never = sum(q["repeat_range"][0] > 0.10 or q["repeat_range"][1] < -0.10 for q in qs)
            pooled = [abs(q["pooled"]["relative_error"]) for q in qs if "pooled" in q]
            print(f"(b) {label}: {within} of {len(qs)} within 10%; over every pairing of repeats, "
                  f"{always} within 10% whichever, {never} outside 10% whichever; from the base repeats "
                  f"pooled (the median of their predictions): {sum(e <= 0.10 for e in pooled)} of "
                  f"{len(pooled)} within 10%, mean {sum(pooled) / max(1, len(pooled)):.1%}, max {max(pooled, default=0):.1%}")
    if s.reused["runs"]:
        print(f"{s.reused['runs']} run(s) read back from {out} (--resume), not measured now")
    print(f"written: {out / 'network_sweep.md'}, {out / 'throughput_vs_link.png'}, {out / 'report' / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
