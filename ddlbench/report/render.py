"""The report's tables, as (head, rows) of strings ("-" where a run has no value), and the notes
and captions that explain them. ddlbench/report/sections.py puts them in order and writes them."""
from __future__ import annotations

from ddlbench.report.fmt import human_bytes as _bytes
from ddlbench.report.fmt import missing as _missing

MAX_RUN_ROWS = 1000   # the per-run table in md/html; summary.csv always has every run

CAPTIONS = {
    "throughput": "Median samples/s per framework and world size; error bars: 95% bootstrap CI over repeats (shown from 5 repeats; fewer give no interval).",
    "scaling": "Scaling efficiency against the smallest world size of the same configuration; weak = per-device batch fixed, strong = global batch fixed.",
    "convergence": "Validation loss and accuracy against epochs and against training time (evaluation excluded). Dashed: the dataset's known floor; dotted: the target.",
    "memory": "Peak memory per rank (GPU: allocated; CPU: host RSS, which includes the Python/torch runtime, and the part above the post-import baseline) next to the theoretical model-state bytes per rank.",
    "communication": "Bytes communicated per training step, counted where the collectives are issued, next to the ring wire volume and the textbook formula.",
    "mfu": "Model FLOPs utilisation: counted FLOPs x samples/s / (devices x peak FLOP/s).",
    "context": "Sequence length: median tokens/s and peak memory per rank of each configuration run at several "
               "model.seq_len values (bench run -m model.seq_len=..., or bench context's runs); x: a length that "
               "ended out of memory.",
    "best": "The fastest configuration per model and device count (the Ultra-Scale Playbook's heatmap): "
            "colour = MFU where every cell has one, else samples/s relative to the model's best; text = the configuration.",
}


def _num(x, fmt=".1f") -> str:
    if _missing(x):
        return "-"
    return format(x, fmt)


def _ci(med, lo, hi, fmt=".1f", rng=None) -> str:
    """median [95% CI] from 5 repeats on; with 2-4 the median and their range, labelled."""
    if _missing(med):
        return "-"
    if _missing(lo):
        if rng is not None and rng[2] >= 2:
            return f"{_num(med, fmt)} (range {_num(rng[0], fmt)}-{_num(rng[1], fmt)}, n={rng[2]})"
        return _num(med, fmt)
    return f"{_num(med, fmt)} [{_num(lo, fmt)}, {_num(hi, fmt)}]"


def cell_table(rep) -> tuple[list[str], list[list[str]]]:
    head = ["framework", "model", "ranks", "precision", "ok/runs", "samples/s [95% CI] or (range)", "scaling",
            "peak mem", "theory", "wire/step", "payload/step", "MFU", "val loss", "val acc", "time to target (s)"]
    rows = []
    for c in rep.cells.itertuples():
        rows.append([c.label, c.model, _num(c.world_size, ".0f"), "-" if _missing(c.precision) else c.precision, f"{c.ok}/{c.runs}",
                     _ci(c.samples_per_s, c.samples_per_s_ci_low, c.samples_per_s_ci_high, rng=c.samples_per_s_range),
                     "-" if _missing(c.scaling_efficiency) else f"{c.scaling_efficiency:.2f} ({c.scaling_kind})",
                     _bytes(c.peak_memory_bytes), _bytes(c.model_state_bytes_theory),
                     # what crosses the wire per rank (0 at one rank), then the payload handed to collectives
                     _bytes(c.comm_wire_bytes_per_rank), _bytes(c.comm_bytes_per_step),
                     "-" if _missing(c.mfu) else f"{c.mfu:.1%}",
                     _num(c.final_val_loss, ".4f"), _num(c.final_val_accuracy, ".3f"),
                     _ci(c.time_to_target_s, c.time_to_target_ci_low, c.time_to_target_ci_high, ".2f",
                         rng=c.time_to_target_range)])
    if any(getattr(c, "settings", "") for c in rep.cells.itertuples()):   # configurations that would look alike
        head.insert(1, "settings")
        for row, c in zip(rows, rep.cells.itertuples()):
            row.insert(1, c.settings or "-")
    return head, rows


def parity_table(rep) -> tuple[list[str], list[list[str]], list[list[bool]]]:
    from ddlbench.report.tables import PARITY_FIELDS
    head = ["model", "ranks", "framework", "first run", "runs", *PARITY_FIELDS, "parity"]
    rows, flags = [], []
    for r in rep.parity.itertuples():
        diff = set(r.differs)
        rows.append([r.model, str(r.world_size), r.label, r.run_id, str(r.runs),
                     *[("-" if getattr(r, f) is None or getattr(r, f) != getattr(r, f) else str(getattr(r, f)))
                       for f in PARITY_FIELDS],
                     "ok" if not diff else "DIFFERS: " + ", ".join(sorted(diff))])
        flags.append([False] * 5 + [f in diff for f in PARITY_FIELDS] + [bool(diff)])
    return head, rows, flags


def failure_table(rep) -> tuple[list[str], list[list[str]]]:
    head = ["run", "framework", "model", "ranks", "status", "error", "rank", "reason"]
    rows = [[f.run_id, f.label, f.model, _num(f.world_size, ".0f"), f.status, f.error_type or "-",
             _num(f.error_rank, ".0f"), f.error_message or "-"] for f in rep.failures.itertuples()]
    return head, rows


def model_parallel_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per rank of every pipeline run: its stages, parameters, model-state theory, peak
    memory and idle fraction, so stage imbalance is visible (result.json `model_parallel`)."""
    head = ["run", "framework", "dp x tp x pp", "schedule", "micro-batches", "bubble (analytic)",
            "rank", "stages", "params", "model state (theory)", "peak mem", "idle (measured)"]
    rows = []
    for run_id, rec in rep.records.items():
        mp, par = rec.get("model_parallel") or {}, rec.get("parallel") or {}
        if rec.get("status") != "ok" or not mp:
            continue
        mem = {m.get("rank"): m for m in (rec.get("memory") or {}).get("per_rank") or []}
        fw = rec.get("framework") or {}
        for rank, st in enumerate(mp.get("per_rank") or []):
            m = mem.get(rank) or {}
            rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}",
                         f"{par.get('dp')} x {par.get('tp')} x {par.get('pp')}", str(mp.get("schedule")),
                         str(mp.get("n_microbatches")), _num(mp.get("bubble_fraction_analytic"), ".3f"), str(rank),
                         ",".join(map(str, st.get("stages") or [])), f"{st.get('params', 0):,}",
                         _bytes(st.get("model_state_bytes_theory")),
                         _bytes(m.get("peak_allocated_bytes") or m.get("peak_rss_bytes")),
                         _num(st.get("idle_fraction_measured"), ".3f")])
    return head, rows[:MAX_RUN_ROWS]


def strategy_table(rep) -> tuple[list[str], list[list[str]]]:
    from ddlbench.report.tables import strategies
    head = ["model", "ranks", "framework", "parallelism", "synchronisation", "communication", "sharding",
            "compression", "sent per rank per step", "vs DDP", "time to target (s)", "vs DDP"]
    if rep.cells.empty:
        return head, []
    rows = [[str(r.model), _num(r.world_size, ".0f"), str(r.label), *("-" if _missing(x) or not x else str(x) for x in (
        r.tax_parallelism, r.tax_synchronisation, r.tax_communication, r.tax_sharding, r.tax_compression)),
        _bytes(r.wire_bytes_per_rank), _num(r.wire_vs_ddp, ".2f"), _num(r.time_to_target_s, ".2f"),
        _num(r.time_to_target_vs_ddp, ".2f")] for r in strategies(rep.cells).itertuples()]
    return head, rows[:MAX_RUN_ROWS]


STRATEGY_NOTE = ("Each configuration's place in the taxonomy of distributed training (parallelism, "
                 "synchronisation, communication pattern, sharding, compression), the bytes each rank sends "
                 "per step (ring/tree volume of the measured collectives, averaged over one period of periodic "
                 "strategies) and its time to target, both relative to DDP at the same model and world size.")


def projection_check_table(rep) -> tuple[list[str], list[list[str]]]:
    """CPU/gloo runs at > 1 rank with a 1-rank run of the same configuration (weak scaling):
    the step time `bench project`'s model predicts (1-rank compute + the run's collectives on
    the network it recorded, else conf/network/local_gloo.yaml) next to the measured one."""
    from ddlbench.network.model import load, recorded_network
    from ddlbench.project.validate import predict
    head = ["framework", "model", "ranks", "measured step (ms)", "predicted (ms)", "error", "compute (ms)",
            "exposed comm (ms)", "core oversubscription"]
    df = rep.summary
    if df.empty or "scaling_group" not in df:
        return head, []
    ok = df[(df["status"] == "ok") & df["step_time_median_s"].notna()]
    singles = {g: p for g, p in zip(ok[ok["world_size"] == 1]["scaling_group"], ok[ok["world_size"] == 1]["path"])}
    rows, net = [], None
    for r in ok[ok["world_size"] > 1].itertuples():
        rec, one = rep.records.get(r.path), rep.records.get(singles.get(r.scaling_group))
        if one is None or (rec.get("env") or {}).get("backend") != "gloo":
            continue
        net = net or load("local_gloo")
        try:
            p = predict(rec, one, recorded_network(rec) or net)
        except Exception:      # a result the model cannot price (tp/pp > 1, ...): left out of the check
            continue
        rows.append([r.label, r.model, _num(r.world_size, ".0f"), _num(p["measured_step_s"] * 1e3, ".2f"),
                     _num(p["predicted_step_s"] * 1e3, ".2f"), f"{p['relative_error']:+.1%}",
                     _num(p["compute_s"] * 1e3, ".2f"), _num(p["exposed_comm_s"] * 1e3, ".2f"),
                     _num(p["oversubscription"], ".1f")])
    return head, rows[:MAX_RUN_ROWS]


PROJECTION_NOTE = ("How far to trust `bench project`: for CPU/gloo runs with a 1-rank run of the same "
                   "configuration, the model's step time (the 1-rank compute, scaled by core "
                   "oversubscription, + the run's measured collectives priced on the network the run recorded "
                   "(inside `bench cluster`: its link rates), else on conf/network/local_gloo.yaml) next to "
                   "the measured one. The error is the model's, on this machine.")


def straggler_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per flagged rank (result.json `stragglers`): how late it joins each step."""
    head = ["run", "framework", "model", "ranks", "rank", "late per step (ms, median)", "share of step",
            "host time per rank (ms, median)"]
    rows = []
    for run_id, rec in rep.records.items():
        st = rec.get("stragglers") or {}
        host = (rec.get("timing") or {}).get("per_rank_host_median_s") or []
        fw = rec.get("framework") or {}
        for r in st.get("flagged") or []:
            rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}",
                         str((rec.get("model") or {}).get("name")), str(len(host)), str(r),
                         _num(st["late_median_s"][r] * 1e3, ".0f"), f"{st['late_fraction'][r]:.0%}",
                         " ".join(_num(h * 1e3, ".0f") for h in host)])
    return head, rows[:MAX_RUN_ROWS]


STRAGGLER_NOTE = ("Ranks that join their steps late: per step, a rank's host time (previous step's end to "
                  "the framework's step call: batch fetch and host work) minus the fastest rank's; flagged "
                  "when the median is at least 10% of the median step time. A synchronous step lasts as long "
                  "as its slowest rank, so every rank's step time shows the delay; this names the rank.")


def comm_time_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per run and collective kind from the profiled steps (result.json comm.time): their
    mean, and the fastest and slowest profiled period, with the best busbw `bench commbench`
    measured for that kind on the same backend and world size."""
    from ddlbench.commbench.command import ceilings
    best = {}
    for cb in rep.commbench:
        for kind, bw in ceilings(cb).items():
            key = (cb.get("backend"), cb.get("world_size"), kind)
            best[key] = max(best.get(key, 0.0), bw)
    head = ["run", "framework", "ranks", "collective", "calls/step", "time/step (ms)", "fastest-slowest (ms)",
            "exposed (ms)", "overlapped", "busbw (GB/s)", "commbench ceiling (GB/s)"]
    rows = []
    for run_id, rec in rep.records.items():
        ct = (rec.get("comm") or {}).get("time")
        if rec.get("status") != "ok" or not ct:
            continue
        fw, world = rec.get("framework") or {}, (rec.get("parallel") or {}).get("world_size")
        for kind, k in ct["kinds"].items():
            ceiling = best.get(((rec.get("env") or {}).get("backend"), world, kind))
            rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}", str(world), kind,
                         _num(k["count"], ".0f"), _num(k["time_s"] * 1e3, ".2f"), _range_ms(k.get("time_s_spread")),
                         _num(k["exposed_s"] * 1e3, ".2f"),
                         f"{k['overlapped_s'] / k['time_s']:.0%}" if k["time_s"] else "-",
                         _num(k["busbw_Bps"] / 1e9 if k.get("busbw_Bps") else None, ".3f"),
                         _num(ceiling / 1e9 if ceiling else None, ".3f")])
    return head, rows[:MAX_RUN_ROWS]


def _range_ms(spread: list | None) -> str:
    """[fastest, median, slowest] seconds -> 'fastest-slowest' in ms; '-' for a record without them."""
    return f"{spread[0] * 1e3:.2f}-{spread[-1] * 1e3:.2f}" if spread else "-"


COMM_TIME_NOTE = ("From extra untimed steps under torch.profiler after the window (run.comm_profile_repeats "
                  "periods, the mean and the fastest and slowest period): per collective, the time it ran (gloo: enqueue "
                  "to completion, so waiting for the slowest peer counts), the exposed part (nothing computed "
                  "meanwhile) and the share overlapped with compute; busbw = payload / time x the nccl-tests "
                  "factor, beside the best `bench commbench` measured for that collective on the same backend "
                  "and ranks (run it into a directory the report reads). Gloo runs reduce-scatter as an "
                  "all-reduce and names it so.")


def flops_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per ok run: MFU and HFU, the FLOP counts behind them, how they were counted, and
    the peak used (its dtype and where it came from)."""
    head = ["run", "framework", "precision", "MFU", "HFU", "model FLOPs/sample", "hardware FLOPs/sample",
            "counted by", "peak FLOP/s per device", "peak dtype", "peak source"]
    rows = []
    for run_id, rec in rep.records.items():
        f = rec.get("flops") or {}
        if rec.get("status") != "ok" or not f:
            continue
        fw = rec.get("framework") or {}
        def pct(v):
            return ("-" if v is None else f"{v:.1%}")
        rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}", str(rec.get("precision")),
                     pct(rec.get("mfu")), pct(f.get("hfu")), _num(f.get("train_per_sample"), ".4g"),
                     _num(f.get("hardware_train_per_sample"), ".4g"),
                     f"{f.get('method')}" + (f" + {f['recompute']}" if f.get("recompute") else ""),
                     _num(f.get("peak_per_device"), ".4g"), str(f.get("peak_dtype") or "-"), str(f.get("peak_source") or "-")])
    return head, rows[:MAX_RUN_ROWS]


FLOPS_NOTE = ("MFU = model FLOPs per sample x samples/s / (devices x peak); HFU the same with the FLOPs the "
              "hardware ran, which add the forward passes that activation checkpointing recomputes. Both "
              "counts come from torch's FLOP counter over one training step of the model (meta device), the "
              "hardware count under the run's checkpointing. The peak is the dense peak for the dtype the "
              "math ran in (fp32 on CUDA: TF32 where torch allows it), from conf/hardware or, on CPU, a "
              "matmul probe.")


def moe_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per ok run of a Mixture-of-Experts model: the layout (ep, experts per rank), active
    parameters, load imbalance across experts and across ep ranks, the load-balancing loss, and the
    all-to-all payload per step against its uniform-routing volume."""
    head = ["run", "framework", "model", "ranks", "ep", "experts/rank", "active / total params",
            "imbalance experts (max, mean)", "imbalance ep ranks", "aux loss", "all-to-all/step (analytic)",
            "experts impl"]
    rows = []
    for run_id, rec in rep.records.items():
        m = rec.get("moe")
        if rec.get("status") != "ok" or not m:
            continue
        fw, model = rec.get("framework") or {}, rec.get("model") or {}
        a2a = m.get("all_to_all_payload_bytes_per_step")
        rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}", str(model.get("name")),
                     str((rec.get("parallel") or {}).get("world_size")), str(m.get("ep")), str(m.get("experts_per_rank")),
                     f"{_num(model.get('active_params'), '.4g')} / {_num(model.get('total_params'), '.4g')}",
                     f"{_num(m.get('imbalance_experts_max'), '.2f')}, {_num(m.get('imbalance_experts_mean'), '.2f')}",
                     _num(m.get("imbalance_ep_ranks_max"), ".2f"), _num(m.get("aux_loss_mean"), ".4f"),
                     "-" if a2a is None else f"{_bytes(a2a)} ({_bytes(m.get('all_to_all_payload_bytes_per_step_analytic'))})",
                     str(m.get("experts_implementation") or "-")])
    return head, rows[:MAX_RUN_ROWS]


MOE_NOTE = ("Mixture-of-Experts runs (the record's `moe`): imbalance = the most tokens an expert (or an ep rank's block of "
            "experts) received over the mean, over every training step (1.0 = perfectly balanced; the worst "
            "layer, and for experts the mean over layers too); aux loss = the router's load-balancing loss "
            "before its coefficient; all-to-all = the busiest rank's payload per step (dispatch, combine and "
            "their gradients) and, in brackets, the volume with uniform routing. Routing is dropless (no "
            "dropped tokens). Without expert parallelism (ep 1) every rank holds every expert.")


ADVICE_NOTE = ("bench advise: candidates ranked by predicted step time (a 1-rank calibration run's compute x "
               "the network model), the top ones measured. Memory: estimate (model state + activations + "
               "buffers + the runtime overhead seen in calibration) vs measured (GPU: peak allocated; CPU: peak "
               "RSS above the post-import baseline). Rank correlation: Spearman over the measured runs.")


def advice_table(rep) -> tuple[list[str], list[list[str]]]:
    head = ["advice", "rank", "candidate", "predicted ms", "measured ms", "step error", "est. MiB",
            "measured MiB", "memory error", "status"]

    def scaled(x, k):
        return None if x is None else x * k
    rows = []
    for a in rep.advice:
        o = a.get("options") or {}
        name = f"{o.get('model')} n={o.get('devices')} (rank corr. {_num(a.get('rank_correlation'), '.2f')})"
        for c in sorted((c for c in a.get("candidates", []) if c.get("measured")),
                        key=lambda c: c.get("rank") or 10**9):
            m, est = c["measured"], (c.get("memory_estimate") or {}).get("with_overhead")
            rows.append([name, str(c.get("rank") or "pruned"), c["label"],
                         _num(scaled((c.get("predicted") or {}).get("step_s"), 1e3)), _num(scaled(m.get("step_s"), 1e3)),
                         _pct(m.get("step_error")), _num(scaled(est, 2**-20), ".0f"),
                         _num(scaled(m.get("memory_bytes"), 2**-20), ".0f"), _pct(m.get("memory_error")),
                         m.get("status", "-") + (" (verify pruned)" if c.get("verify_pruned") else "")])
    return head, rows


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.0%}"


def run_table(rep) -> tuple[list[str], list[list[str]]]:
    head = ["run", "status", "framework", "model", "ranks", "global batch", "repeat", "samples/s",
            "step (ms)", "peak mem", "MFU", "val loss", "time to target (s)"]
    rows = [[r.run_id, r.status, r.label, r.model, _num(r.world_size, ".0f"), _num(r.global_batch, ".0f"),
             _num(r.repeat, ".0f"), _num(r.samples_per_s), _num(None if r.step_time_median_s is None else r.step_time_median_s * 1e3),
             _bytes(r.peak_memory_bytes), "-" if _missing(r.mfu) else f"{r.mfu:.1%}",
             _num(r.final_val_loss, ".4f"), _num(r.time_to_target_s, ".2f")]
            for r in rep.summary.head(MAX_RUN_ROWS).itertuples()]
    return head, rows


MODEL_PARALLEL_NOTE = ("Pipeline runs, one row per rank: its stages, parameters and model-state bytes "
                      "(stage imbalance), peak memory, and the idle fraction measured as 1 - busy/step "
                      "next to the schedule's analytic bubble.")


def checkpoint_table(rep) -> tuple[list[str], list[list[str]]]:
    """One row per ok run that saved checkpoints (run.checkpoint): how, what each save cost the loop,
    when it was on disk, what the steps lost meanwhile, and the rate beside a plain write."""
    head = ["run", "framework", "model", "ranks", "mode", "saves", "blocked (median)", "durable (median)",
            "slowdown while written", "bytes/save", "rate (plain write)", "a failure lost"]
    rows = []
    for run_id, rec in rep.records.items():
        c = rec.get("checkpoint")
        if rec.get("status") != "ok" or not c:
            continue
        fw, rate, plain = rec.get("framework") or {}, c.get("bytes_per_s"), c.get("plain_write_bytes_per_s")
        rows.append([str(rec.get("run_id", run_id)), f"{fw.get('name')}:{fw.get('variant')}",
                     str((rec.get("model") or {}).get("name")), str((rec.get("parallel") or {}).get("world_size")),
                     str(c.get("mode")), str(len(c.get("saves") or [])), f"{_num(c.get('blocked_s_median'), '.3f')} s",
                     f"{_num(c.get('durable_s_median'), '.3f')} s",
                     "-" if c.get("slowdown_median") is None else f"{c['slowdown_median']:+.1%}",
                     _bytes(c.get("bytes_per_save")),
                     f"{_bytes(rate)}/s ({_bytes(plain)}/s)" if rate else "-", _lost(rec.get("recovery"))])
    return head, rows[:MAX_RUN_ROWS]


def _lost(r: dict | None) -> str:
    """A restarted run's loss: seconds, and the steps trained again."""
    if not r or r.get("lost_s") is None:
        return "-"
    return f"{r['lost_s']:.2f} s ({r['steps_lost']} steps redone)"


CHECKPOINT_NOTE = ("Runs that saved checkpoints (run.checkpoint; the record's `checkpoint`): blocked = how long the loop "
                   "stopped between two steps for a save (slowest rank; no step time holds it), durable = until the "
                   "last rank's write was on disk; an async save writes while the next steps run, and slowdown is "
                   "those steps' mean over the window's median step. rate = bytes / durable time, beside a plain "
                   "fsynced write of as many bytes to the same directory. A failure lost = for a run restarted after a "
                   "killed rank (launcher.max_restarts; the record's `recovery`): from the fault until the new "
                   "attempt was back at the fault's step, and the steps it trained again since the save it resumed.")
