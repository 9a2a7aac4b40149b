"""`bench project model=NAME framework=NAME network=NAME [key=value ...]`: a layout projected from
its specification, no run needed (ddlbench/estimate/scale.py). Every Hydra override a run takes
(framework.options.tp=8, run.precision=bf16, model.seq_len=...) passes through to the planner."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.record.results import atomic_write_json

KEYS = {"network", "world_sizes", "hardware", "peak_tflops", "local_batch", "ac", "mfu", "calibrate",
        "device_memory_gb", "per_node", "algorithm", "max_efficiency", "out", "replace", "attention_efficiency",
        "dispatch", "routing", "memory_tbs", "kernels"}
DEFAULT_WORLD_SIZES = [8, 128, 1024]
DEFAULT_MFU = 0.4
# the most of a dense datasheet peak a calibration may solve for: the best published bf16 training runs
# reach ~55-60% MFU (torchtitan, Megatron), one matmul ~75-80% (the H200 probe: 790 of 989 TFLOP/s); above
# this the schedule has mispriced a cost the step carries, and the projection would carry it along
MAX_EFFICIENCY = 0.85
USAGE = ("usage: bench project model=NAME framework=NAME network=NAME hardware=H100 [world_sizes=[8,128,1024]] "
         "[local_batch=N] [ac=none|full|selective_layer:K|selective_op] [mfu=0.4 | calibrate=TOKENS_PER_S@DEVICES | "
         "calibrate=pieces] [attention_efficiency=F] [max_efficiency=0.85] "
         "[kernels=none|eager|fused [memory_tbs=3.35]] [device_memory_gb=80] [per_node=8] [algorithm=best|ring|tree|hierarchical|gloo] [dispatch=all_to_all|deepep] "
         "[routing=uniform|balanced] [out=DIR] [any run override]")


def is_spec(args: list[str]) -> bool:
    """A specification (no RESULT argument, a model= or framework= given)."""
    return not any("=" not in a for a in args) and any(a.startswith(("model=", "framework=")) for a in args)


def gpu_entry(name: str) -> dict:
    """A device's row of conf/hardware/auto.yaml's gpu_table (the key matched case-insensitively: h100, H200,
    'A100'): its dense peaks and its memory's bandwidth (hbm)."""
    import yaml

    from ddlbench.planning.config import CONF_DIR
    table = yaml.safe_load((CONF_DIR / "hardware" / "auto.yaml").read_text())["gpu_table"]
    key = next((k for k in table if k.lower() == name.lower()), None)
    if key is None:
        raise ConfigError(f"bench project: hardware={name!r} has no peak in conf/hardware/auto.yaml's gpu_table "
                          f"(known: {', '.join(table)}); or give peak_tflops=")
    return table[key]


def gpu_peak(name: str, precision: str) -> float:
    """A device's dense peak at the precision from conf/hardware/auto.yaml's gpu_table."""
    from ddlbench.machine.hardware import peak_dtype
    return float(gpu_entry(name)[peak_dtype("cuda", precision)])


KERNELS = ("none", "eager", "fused")


def memory_rate(kv, kernels: str) -> tuple[float | None, str]:
    """(the memory's bytes/s, where it came from) for pricing the ops other than matmuls (`kernels=` eager or
    fused): memory_tbs=, else the hardware's gpu_table hbm; (None, '') with kernels=none (folded into the
    efficiency, as the roofline had it)."""
    if kernels == "none":
        if kv.text("memory_tbs"):
            raise ConfigError("bench project: memory_tbs= prices the ops other than matmuls: give kernels=eager or "
                              "kernels=fused with it (how the stack runs them)")
        return None, ""
    if kv.text("memory_tbs"):
        return kv.number("memory_tbs", positive=True) * 1e12, "memory_tbs="
    hbm = gpu_entry(kv.text("hardware")).get("hbm") if kv.text("hardware") else None
    if not hbm:
        raise ConfigError(f"bench project: kernels={kernels} prices bytes at the memory's rate: give memory_tbs= (TB/s)"
                          + (f" ({kv.text('hardware')} has no hbm in conf/hardware/auto.yaml's gpu_table)"
                             if kv.text("hardware") else " or hardware= with an hbm in gpu_table"))
    return float(hbm), f"{kv.text('hardware')} hbm (gpu_table)"


def parse(args: list[str]):
    from ddlbench.settings.keyvalue import parse_key_values
    kv = parse_key_values(args, "bench project", KEYS, passes=lambda k: k in ("model", "framework") or "." in k
                          or k.startswith("+"), required=("network",), usage=USAGE,
                          passes_hint="run overrides: model=, framework=, run.*, framework.options.*, model.*")
    if not any(a.startswith("model=") for a in kv.passed) or not any(a.startswith("framework=") for a in kv.passed):
        raise ConfigError(f"bench project: a specification needs model= and framework=\n{USAGE}")
    return kv


def calibration(text: str) -> tuple[float, int]:
    rate, sep, devices = text.partition("@")
    try:
        out = float(rate), int(devices)
    except ValueError:
        out = None
    if not sep or out is None or not math.isfinite(out[0]) or out[0] <= 0 or out[1] < 1:
        raise ConfigError(f"bench project: calibrate must be TOKENS_PER_S_PER_DEVICE@DEVICES (e.g. 5762@8), got {text!r}")
    return out


def check_efficiency(spec, pricing, eff: float, world: int, bound: float, asked: str, peak_src: str) -> None:
    """A calibration that needs the compute above `bound` of the peak is refused, with what else the
    simulated step at that efficiency spends its time on: the suspects a schedule may have overpriced."""
    if eff <= bound:
        return
    from ddlbench.estimate.scale import step_of
    from ddlbench.project.spec import _profile, plan_at
    plan = plan_at(spec, world)
    s = step_of(plan, _profile(plan, spec.device), pricing, spec.peak_flops * eff, plan.variant.ac_policy(),
                spec.per_node, ranks_per_core=spec.ranks_per_core, attention_flops_per_s=spec.attention_flops(), ridge=spec.ridge,
                kernels=spec.kernels)
    def ms(x: float) -> str:
        return f"{x * 1e3:,.1f} ms" if x >= 0.01 else f"{x * 1e3:.3g} ms"
    others = sorted(((k, v) for k, v in s["exposed"].items() if v > 0), key=lambda kv: -kv[1])
    bubble = s["step_s"] - s["compute_s"] - sum(v for _, v in others)
    parts = [f"{k} exposed {ms(v)}" for k, v in others[:4]] + (
        [f"idle (bubble, waits) {ms(bubble)}"] if bubble > 1e-3 * s["step_s"] else [])
    raise ConfigError(
        f"bench project: {asked} needs the compute at {eff:.1%} of the peak ({peak_src}), above max_efficiency={bound:g}: "
        f"no dense training step runs so close to the datasheet; a cost the step carries is likely mispriced. Of the "
        f"simulated {ms(s['step_s'])} step at {world} devices, compute is {ms(s['compute_s'])}"
        + (f"; the rest: {'; '.join(parts)}" if parts else "") + ". Check the layout, the network and the published "
        "figure, or pass max_efficiency= to accept it knowingly")


def run(args: list[str]) -> int:
    from ddlbench.estimate.scale import Pricing
    from ddlbench.models.checkpointing import normalize
    from ddlbench.network import model
    from ddlbench.project.spec import Spec, rows, solve_efficiency, timed_pieces

    kv = parse(args)
    sizes = world_sizes(kv, DEFAULT_WORLD_SIZES)
    net = model.for_world_sizes(kv.text("network"), sizes)
    try:
        ac = normalize(kv.text("ac", "none"))
    except ValueError as exc:
        raise ConfigError(f"bench project: ac: {exc}") from None
    algorithm = kv.choice("algorithm", ("best", *model.ALGORITHMS, model.GLOO), "best")   # gloo: its flat rings
    precision = next((a.split("=", 1)[1] for a in kv.passed if a.startswith("run.precision=")), "fp32")
    if kv.text("peak_tflops"):
        peak, peak_src = kv.number("peak_tflops", positive=True) * 1e12, "peak_tflops="
    elif kv.text("hardware"):
        peak, peak_src = gpu_peak(kv.text("hardware"), precision), f"{kv.text('hardware')} {precision} (gpu_table)"
    else:
        raise ConfigError(f"bench project: give hardware= (a gpu_table name) or peak_tflops= for the roofline\n{USAGE}")
    mem = kv.number("device_memory_gb", positive=True)
    overrides = tuple(kv.passed)
    if kv.text("hardware") and not any(a.startswith("run.device=") for a in overrides):
        # planned for the GPU it names, wherever this runs: its attention (sdpa_causal), padding and streams
        overrides += ("run.device=cuda",)
    # the T x T attention matmuls at their own fraction of the peak (Float8 speeds only the linear layers):
    # an assumption the user states; mfu= / calibrate= then give the rest's
    attn = kv.number("attention_efficiency", low=1e-4, high=1.0) if kv.text("attention_efficiency") else None
    # the ops other than matmuls (norms, activations, casts, a MoE layer's token copies, the loss) at the memory's
    # rate, as the stack runs them: eager (every op), fused (the chains between matmuls one kernel each), or none
    # (folded into the efficiency); ddlbench/models/flops.MemoryTraffic counts them
    kernels = kv.choice("kernels", KERNELS, "none")
    bandwidth, bandwidth_src = memory_rate(kv, kernels)
    spec = Spec(overrides, kv.integer("local_batch", 1), peak, ac,
                kv.integer("per_node", net.dims[0].size), mem * 2**30 if mem else None, attention_efficiency=attn,
                ridge=peak / bandwidth if bandwidth else 0.0, kernels=kernels)
    # expert parallelism's dispatcher and routing as priced (ddlbench/estimate/dispatch.py): ours is an
    # all_to_all of every (token, expert) under the model's learned router; deepep / balanced price other stacks'
    from ddlbench.estimate.dispatch import DISPATCHERS, ROUTINGS
    dispatch, routing = kv.choice("dispatch", DISPATCHERS, "all_to_all"), kv.choice("routing", ROUTINGS, "uniform")
    pricing = Pricing(net, algorithm, dispatch, routing)
    measured = per_param = factor = None
    try:
        if kv.text("calibrate") == "pieces":      # compute per piece timed on the device at hand
            # the framework's own step where it shards and communicates: at the smallest world asked above one rank
            got = timed_pieces(spec, sizes[0], framework_world=next((w for w in sizes if w > 1), sizes[0]))
            measured, eff = got["per_sample"], got["efficiency"]
            per_param = got["optimizer"]["optimizer_s_per_param"]
            fw = got["framework"] or {}
            factor = fw.get("factor")
            if factor:        # the framework's own per-step work (hooks, casts) at the layout, on every piece
                measured = [(f * factor, b * factor) for f, b in measured]
            eff_src = ("per piece, timed on this host's " + got["device"] + f" at micro-batch {got['micro_batch']}, "
                       f"{got['precision']}, a block as the model at 5 blocks less 1, over 4 (ms forward/backward: " + ", ".join(
                           f"{k} {f * 1e3:.2f}/{b * 1e3:.2f}" for k, (f, b) in got["timed"].items())
                       + f"); the optimizer's step {per_param * 1e9:.3f} ns per parameter stepped "
                       f"({got['optimizer'].get('optimizer_rule', 'slope over the blocks')}); "
                       + (f"x {factor:.3f} for the framework's own step at {fw['world']} ranks (over a fake group)"
                          if factor else f"the framework's own step not timed ({fw.get('error', 'not asked')})"))
        elif kv.text("calibrate"):
            rate, at = calibration(kv.text("calibrate"))
            if at > net.max_devices:
                raise ConfigError(f"calibrate: {at} devices exceed network {net.name} ({net.max_devices:,})")
            eff = solve_efficiency(spec, pricing, rate, at)
            check_efficiency(spec, pricing, eff, at, kv.number("max_efficiency", MAX_EFFICIENCY, low=0.01, high=1.0),
                             f"calibrate={kv.text('calibrate')}", peak_src)
            eff_src = f"calibrated: {rate:g} tokens/s per device at {at} devices reproduced"
        else:
            eff = kv.number("mfu", DEFAULT_MFU, low=1e-4, high=1.0)
            eff_src = "mfu= (an assumption)" if kv.text("mfu") else f"assumed {DEFAULT_MFU:g} of peak (no mfu= or calibrate=)"
        if attn:
            eff_src += f"; the T x T attention matmuls at {attn:g} of the peak (attention_efficiency=, an assumption)"
        if bandwidth:
            eff_src += (f"; the other ops' bytes ({kernels}) at {bandwidth / 1e12:g} TB/s ({bandwidth_src}) x the same "
                        "efficiency")
        table = rows(spec, pricing, sizes, eff, measured, per_param and per_param * (factor or 1.0))
    except ConfigError:
        raise
    except ValueError as exc:        # the network model or the schedule refusing a layout
        raise ConfigError(f"bench project: {exc}") from None
    name = "_".join(a.split("=", 1)[1] for a in kv.passed if a.startswith(("model=", "framework=")))
    out = claim_out(Path(kv.text("out") or f"projection_{name}_{net.name}"), kv)
    doc = {"specification": list(spec.overrides), "network": net.name, "network_file": net.source, "algorithm": algorithm,
           "dispatch": dispatch, "routing": routing, "peak_flops": peak, "peak_source": peak_src, "efficiency": eff, "efficiency_source": eff_src, "attention_efficiency": attn, "ac": ac,
           "kernels": kernels, "memory_bytes_per_s": bandwidth,
           "local_batch": spec.local_batch, "per_node": spec.per_node, "method": (
               "planned per world size as a run (ddlbench.planning.config), pieces timed by the roofline, each unit's collectives "
               "priced on the network, the step simulated with the framework's rules (ddlbench/estimate/rules.py)"),
           "not_priced": ("" if per_param else "the optimizer step, ") + "launch gaps, compute slowed by overlapped "
                         "communication, stragglers, congestion",
           "rows": table}
    if measured:
        doc["pieces_timed_s"] = {k: list(v) for k, v in got["timed"].items()}
        doc["pieces_timed_at"] = {k: got[k] for k in ("device", "micro_batch", "precision")}
        doc["framework_timed"] = got["framework"]
        doc["optimizer_timed"] = {"s_per_param": per_param,
                                  "step_s_at_blocks": {str(k): v for k, v in got["optimizer"]["optimizer_step_s"].items()},
                                  "s_per_param_from": got["optimizer"].get("optimizer_rule"),
                                  "rule": "optimizer_s = s_per_param x the parameters the busiest rank steps (its "
                                          "shard where the framework shards optimizer state), after the schedule"}
    write(doc, out)
    return 0


def write(doc: dict, out: Path) -> None:
    """projection.json and projection.csv, then the table on the terminal."""
    atomic_write_json(out / "projection.json", doc)
    with open(out / "projection.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["devices", "dp_replicate", "dp_shard", "cp", "tp", "pp", "step_s", "exposed_comm_s",
                    "tokens_per_s_per_device", "mfu", "memory_per_rank_bytes", "ep"])
        for r in doc["rows"]:
            lay = r["layout"]
            w.writerow([r["devices"], lay["dp_replicate"], lay["dp_shard"], lay.get("cp", 1), lay["tp"], lay["pp"], r["step_s"],
                        r["exposed_comm_s"], r["tokens_per_s_per_device"], r["mfu"], r["memory_per_rank_bytes"],
                        lay.get("ep", 1)])
    _print(doc, out)


def _print(doc: dict, out: Path) -> None:
    from ddlbench.record.table import text_table
    print(f"{' '.join(doc['specification'])} on {doc['network']}: compute at {doc['efficiency']:.1%} of "
          f"{doc['peak_flops'] / 1e12:,.1f} TFLOP/s ({doc['efficiency_source']}; peak: {doc['peak_source']})"
          + (f", ac={doc['ac']}" if doc['ac'] else ""))

    def mem(r):
        if r["memory_per_rank_bytes"] is None:
            return "-"
        fits = {True: " fits", False: " DOES NOT FIT"}.get(r.get("fits"), "")
        return f"{r['memory_per_rank_bytes'] / 2**30:.1f}{fits}"

    def top(r):
        items = sorted(r["exposed_by_kind_s"].items(), key=lambda kv: -kv[1])[:2]
        return ", ".join(f"{k} {v * 1e3:.1f}" for k, v in items) or "-"
    def shape(lay):     # ep borrows its ranks from dp_shard: said beside the product, not a factor of it
        ep = lay.get("ep", 1)
        return "x".join(str(lay.get(k, 1)) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")) + (
            f" (ep {ep})" if ep > 1 else "")
    print(text_table(["devices", "dp_rep x dp_shard x cp x tp x pp", "step ms", "exposed comm ms", "tokens/s/device", "MFU",
                      "memory/rank GiB", "largest exposed (ms)"],
                     [[str(r["devices"]), shape(r["layout"]),
                       f"{r['step_s'] * 1e3:.1f}", f"{r['exposed_comm_s'] * 1e3:.1f}",
                       f"{r['tokens_per_s_per_device']:,.0f}", f"{r['mfu']:.1%}", mem(r), top(r)] for r in doc["rows"]]))
    print(f"not priced: {doc['not_priced']}")
    for name in ("projection.json", "projection.csv"):
        print(f"  {out / name}")


MAX_WORLD_SIZES = 64     # rows of one projection (3,000 sizes ran past 200 s without a word)


def world_sizes(kv, default: list[int]) -> list[int]:
    """world_sizes=[...]: ascending, each once, at most MAX_WORLD_SIZES of them."""
    sizes = sorted(set(kv.integers("world_sizes", default)))
    if len(sizes) > MAX_WORLD_SIZES:
        raise ConfigError(f"bench project: at most {MAX_WORLD_SIZES} world_sizes, got {len(sizes)}")
    return sizes


OUT_FILES = ["projection.json", "projection.csv", "projection.png"]


def claim_out(out: Path, kv) -> Path:
    """`bench project`'s output directory (ddlbench.lifecycle.ownership.claim_output): files
    ddlbench did not write are never replaced unless replace=true."""
    from ddlbench.lifecycle.ownership import claim_output
    return claim_output(out, "bench project", OUT_FILES, "pass replace=true",
                        kv.choice("replace", ("true", "false"), "false") == "true")


def project_record(rec: dict, path: Path, o, sizes: list[int]) -> int:
    """A run of a model-parallel layout (tp, pp or cp > 1) at other world sizes: its configuration
    re-planned at each (ddlbench/project/spec.py), the step simulated with the framework's rules,
    the compute's efficiency solved so that the simulated step on the network the run ran on
    (`measured_on`, else the one it recorded, else local_gloo) gives the run's measured throughput."""
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    from ddlbench.project.spec import Spec, rows, solve_efficiency
    if rec.get("status") != "ok":
        raise ConfigError(f"run {rec.get('run_id')} is {rec.get('status')}: only ok runs can be projected")
    for key in ("allocate", "compute_from", "overlap"):
        if o.text(key):
            raise ConfigError(f"bench project: {key}= is for data-parallel runs; this run is model-parallel "
                              "(its step is simulated with its framework's rules)")
    if o.text("scaling", "weak") != "weak":
        raise ConfigError("bench project: a model-parallel run projects at its per-device batch (scaling=weak)")
    net = model.for_world_sizes(o.text("network"), sizes)
    par, env = rec["parallel"], rec.get("env") or {}
    measured_on = (model.load(o.text("measured_on")) if o.text("measured_on")
                   else model.recorded_network(rec) or model.load("local_gloo"))
    algorithm = o.text("algorithm", "auto")
    measured_alg = model.backend_algorithm(env.get("backend")) if algorithm == "auto" else algorithm
    target_alg = "best" if algorithm in ("auto", model.GLOO) else algorithm
    peak = (rec.get("flops") or {}).get("peak_per_device")
    if not peak:
        raise ConfigError("bench project: the run recorded no peak FLOP/s (flops.peak_per_device) for the roofline")
    world = int(par["world_size"])
    spec = Spec((), int(par["global_batch"]) // int(par["dp"]), float(peak), per_node=net.dims[0].size,
                config=rec["config"], device="cuda" if env.get("backend") == "nccl" else "cpu",
                keep={k: int(par.get(k) or 1) for k in ("tp", "pp", "cp")})
    tp = rec.get("throughput") or {}
    measured = (tp.get("tokens_per_s") or tp.get("samples_per_s")) / world
    try:
        eff = solve_efficiency(spec, Pricing(measured_on, measured_alg), measured, world)
        table = rows(spec, Pricing(net, target_alg), sizes, eff)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"bench project: {exc}") from None
    out = claim_out(Path(o.text("out") or ((path if path.is_dir() else path.parent) / f"projection_{net.name}")), o)
    doc = {"run_id": rec.get("run_id"), "specification": [f"run {rec.get('run_id')}"], "network": net.name,
           "network_file": net.source, "algorithm": target_alg, "peak_flops": float(peak),
           "peak_source": "the run's flops.peak_per_device", "efficiency": eff,
           "efficiency_source": (f"calibrated: the run's {measured:,.1f} per device at {world} devices reproduced on "
                                 f"{measured_on.name} ({measured_alg})"),
           "ac": None, "local_batch": spec.local_batch, "per_node": spec.per_node,
           "method": (f"the run's configuration re-planned per world size, tp {par.get('tp')}, pp {par.get('pp')} and "
                      f"cp {par.get('cp') or 1} kept and data parallelism over the rest (TP: FSDP2 over dp_shard; a "
                      "pipeline, Ulysses: replicas), its step simulated (ddlbench/estimate/rules.py)"),
           "not_priced": "the optimizer step, launch gaps, compute slowed by overlapped communication, stragglers, congestion",
           "rows": table}
    write(doc, out)
    return 0
