"""Numbers in prose that come from records, checked against the records (issue 53): each claim is a
file, the text as written there with the numbers left as {} slots, and how each number is computed
from the committed records. A claim whose text is not in its file fails: either the prose drifted
from the data or the data changed, and the prose must say what the records say."""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "reports" / "gpu-h200" / "2026-11-26"
H200_README = "reports/gpu-h200/2026-11-26/README.md"
GiB = 1 << 30


def rec(path: str) -> dict:
    return json.loads((H200 / path / "result.json").read_text())


def llama(framework: str, suffix: str = "") -> dict:
    step = "B2" if framework in ("ddp_bf16_hook", "fsdp_offload") else "B"
    return rec(f"{step}/runs/{framework}-llama_1b-bf16-micro_batch_auto{suffix}")


def overhead(i: int) -> dict:
    return json.loads((H200 / "A" / f"runner_overhead_{i}.json").read_text())


def tokens(r: dict) -> float:
    return r["throughput"]["tokens_per_s"]


def sps(r: dict) -> float:
    return r["throughput"]["samples_per_s"]


def median_sps(r: dict) -> float:
    return r["parallel"]["global_batch"] / r["timing"]["step_time_s"]["median"]


def mfu(r: dict) -> str:
    return f"{100 * r['mfu']:.1f}%"


def peak_gib(r: dict) -> str:
    return f"{max(m['peak_allocated_bytes'] for m in r['memory']['per_rank']) / GiB:.1f}"


def startup(r: dict, key: str = "total_to_first_step") -> float:
    return r["startup_s"][key]


def thousands(x: float) -> str:
    return f"{x / 1000:.1f}k"


EAGER = ("fsdp_grad_op", "fsdp_full", "fsdp_hybrid", "ddp", "deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero1",
         "deepspeed_zero0", "ddp_bf16_hook")
STEP_B = [*EAGER, "fsdp_offload"]
FIRST_SESSION = ["g1/runs/ddp-gpt2_small-bf16", "g1/runs/ddp-gpt2_small-bf16-activation_gelu_new-pad_vocab_to_1-impl_foreach",
                 "g1/runs/ddp-resnet50-bf16-global_batch_128-micro_batch_auto",
                 "g2/runs/ddp-gpt2_small-bf16-global_batch_32-micro_batch_auto",
                 "g2/runs/ddp-gpt2_small-bf16-global_batch_32-micro_batch_auto-compile_true",
                 "g2/runs/deepspeed_zero2-gpt2_small-bf16-global_batch_32-micro_batch_auto-compile_true",
                 "g2/runs/deepspeed_zero3-llama_1b-bf16-micro_batch_auto", "g2/runs/fsdp_full-llama_1b-bf16-micro_batch_auto",
                 "g2/runs/fsdp_full-llama_1b-bf16-micro_batch_auto-compile_true",
                 "g2/runs/fsdp_full-resnet50-bf16-global_batch_128-micro_batch_auto"]


def _eager_span() -> tuple[float, float]:
    t = [tokens(llama(f)) for f in EAGER] + [tokens(llama("ddp", "-repeat_1"))]
    return min(t), max(t)


def _b_row(framework: str) -> list[str]:
    r, fastest = llama(framework), _eager_span()[1]
    return [f"{tokens(r):,.0f}", f"{tokens(r) / fastest:.2f}", mfu(r), peak_gib(r), f"{startup(r):.1f}"]


def _float8_weighted() -> list[str]:
    """The float8 run's share of float8 FLOPs and its MFU on a FLOP-weighted peak, from the record's
    model shapes (this record predates `flops.float8_share`; every linear layer of each block was
    converted, lm_head kept: its native_config.float8)."""
    from ddlbench.metrics.mfu import float8_share, float8_weighted_mfu
    r = _float8()
    assert r["framework"]["native_config"]["float8"]["kept"] == ["net.lm_head"]
    c = r["model"]["native_config"]
    hidden, kv = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"]
    weights = c["num_hidden_layers"] * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * c["intermediate_size"])
    share = float8_share(weights, r["model"]["tokens_per_sample"], r["flops"]["train_per_sample"])
    return [f"{100 * share:.1f}", f"{100 * float8_weighted_mfu(r['mfu'], share):.1f}"]


def _step_b() -> list[dict]:
    """Every step B record: each framework once, DDP's repeat, the compiled float8 run."""
    return [*(llama(f) for f in STEP_B), llama("ddp", "-repeat_1"), _float8()]


def _float8() -> dict:
    return llama("fsdp_full", "-compile_true-float8_true")


CLAIMS = [
    # the H200 plan's report: step A, the runner against a plain loop
    (H200_README, "| no | {} (pairs {}, {}) | {} ({}, {}) | **{}** |",
     lambda: [f"{overhead(0)['bare_samples_per_s']:.2f}", *(f"{b:.2f}" for _, b in overhead(0)["pairs"]),
              f"{overhead(0)['runner_samples_per_s']:.2f}", *(f"{h:.2f}" for h, _ in overhead(0)["pairs"]),
              f"{overhead(0)['ratio']:.3f}"]),
    (H200_README, "| yes | {} ({}, {}) | {} ({}, {}) | **{}** |",
     lambda: [f"{overhead(1)['bare_samples_per_s']:.2f}", *(f"{b:.2f}" for _, b in overhead(1)["pairs"]),
              f"{overhead(1)['runner_samples_per_s']:.2f}", *(f"{h:.2f}" for h, _ in overhead(1)["pairs"]),
              f"{overhead(1)['ratio']:.3f}"]),
    (H200_README, "(peak allocated {} GiB in both)",
     lambda: [f"{overhead(0)['runner_peak_allocated_bytes'] / GiB:.2f}"]),
    (H200_README, "today's defaults at {} ({}x; first session {}x)",
     lambda: [f"{sps(rec('A/runs/ddp-gpt2_small-bf16-trace_true')):.1f}",
              f"{sps(rec('A/runs/ddp-gpt2_small-bf16-trace_true')) / sps(rec('A/runs/ddp-gpt2_small-bf16-activation_gelu_new-pad_vocab_to_1-impl_foreach')):.2f}",
              f"{sps(rec(FIRST_SESSION[0])) / sps(rec(FIRST_SESSION[1])):.2f}"]),
    (H200_README, "**At one rank the frameworks are within {}% of each other** ({}-{} tokens/s, {}-{}",
     lambda: [f"{100 * (1 - _eager_span()[0] / _eager_span()[1]):.1f}", thousands(_eager_span()[0]),
              thousands(_eager_span()[1]), mfu(llama("ddp_bf16_hook"))[:-1], mfu(llama("fsdp_grad_op"))]),
    (H200_README, "FSDP2: {}x eager** on the\n  window's throughput ({}x on the median steps",
     lambda: [f"{sps(_float8()) / sps(llama('fsdp_full')):.2f}", f"{median_sps(_float8()) / median_sps(llama('fsdp_full')):.2f}"]),
    (H200_README, "bf16's: {}% of the step's FLOPs ran as float8 matmuls, so on a FLOP-weighted fp8/bf16 peak the\n"
                  "  run is at {}% MFU", lambda: _float8_weighted()),
    (H200_README, "doubled DDP's GPT-2 124M throughput ({}x);",
     lambda: [f"{sps(rec(FIRST_SESSION[0])) / sps(rec(FIRST_SESSION[1])):.2f}"]),
    (H200_README, "**Start-up on the GPU**: {}-{} s before the first step per cell",
     lambda: [f"{min(startup(rec(p)) for p in FIRST_SESSION):.1f}", f"{max(startup(rec(p)) for p in FIRST_SESSION):.1f}"]),
    (H200_README, "**Start-up per cell**: {}-{} s before the first step, of which validation {}-{} s",
     lambda: [f"{min(startup(r) for r in _step_b()):.1f}", f"{max(startup(r) for r in _step_b()):.1f}",
              f"{min(startup(r, 'cli_parse_validate') for r in _step_b()):.1f}",
              f"{max(startup(r, 'cli_parse_validate') for r in _step_b()):.1f}"]),
    (H200_README, "(`startup_s.compile_s`, the first compiled step): {} s (GPT-2,\n  `Module.compile` per block)",
     lambda: [f"{startup(rec(FIRST_SESSION[4]), 'compile_s'):.1f}"]),
    # docs/gpu.md's status and the root README say the same
    ("docs/gpu.md", "1.002x eager and 1.001x compiled ({}k and {}k tokens/s",
     lambda: [f"{overhead(0)['runner_samples_per_s'] * 1024 / 1000:.0f}", f"{overhead(1)['runner_samples_per_s'] * 1024 / 1000:.0f}"]),
    ("docs/gpu.md", "{}-{} tokens/s, {}-{} MFU, DDP's two\nruns {}% apart, FSDP2's CPU offload {}; FSDP2 with per-block "
                    "compile and float8 matmuls {}\ntokens/s, {} MFU",
     lambda: [thousands(_eager_span()[0]), thousands(_eager_span()[1]), mfu(llama("ddp_bf16_hook"))[:-1],
              mfu(llama("fsdp_grad_op")), f"{100 * (tokens(llama('ddp', '-repeat_1')) / tokens(llama('ddp')) - 1):.2f}",
              thousands(tokens(llama("fsdp_offload"))), thousands(tokens(_float8())), mfu(_float8())]),
    ("README.md", "GPT-2 124M under DDP at {}k tokens/s eager and {}k compiled",
     lambda: [f"{overhead(0)['runner_samples_per_s'] * 1024 / 1000:.0f}", f"{overhead(1)['runner_samples_per_s'] * 1024 / 1000:.0f}"]),
    ("README.md", "Llama 3.2 1B shapes at {}-{} MFU for every one-GPU framework\neager (CPU offload aside) and {} with",
     lambda: [mfu(llama("ddp_bf16_hook"))[:-1], mfu(llama("fsdp_grad_op")), mfu(_float8())]),
]

# the second 2026-11-27 session (steps C and part of A): its README's table and prose, docs/gpu.md's status
H200_27 = REPO / "reports" / "gpu-h200" / "2026-11-27"
README_27 = "reports/gpu-h200/2026-11-27/README.md"
SDPA = "C/runs/fsdp_full-llama_1b-bf16-micro_batch_2-attention_sdpa"
RESNET = "CA/runs/fsdp_full-resnet50-bf16-global_batch_128"


def record_in(root: Path, path: str) -> dict:
    return json.loads((root / path / "result.json").read_text())


rec27 = partial(record_in, H200_27)


def _gc_row(path: str) -> list[str]:
    """The window's slowest step, its excess over the median, the full collection in it, the young collections."""
    h = rec27(path)["timing"]["host_events"]
    slow, gc = h["slowest_step"], h["per_rank"][0]["gc"]
    full = [e["s"] for e in gc["listed"] if e["generation"] == 2 and e["step"] == slow["measured_step"]]
    return [str(slow["measured_step"]), f"{slow['over_median_s']:.3f}", f"{full[0]:.3f}",
            str(gc["collections"]["0"]), str(gc["collections"]["1"])]


def _gc_share() -> list[str]:
    shares = [float(r[2]) / float(r[1]) for r in map(_gc_row, (SDPA, RESNET, RESNET + "-batch_norm_units_per_layer"))]
    return [f"{100 * min(shares):.0f}", f"{100 * max(shares):.0f}"]


CLAIMS += [
    (README_27, "| fsdp_full llama_1b, micro-batch 2 x 4 accumulated, `attention=sdpa` | {} | {} s | {} s | {} / {} |",
     lambda: _gc_row(SDPA)),
    (README_27, "| fsdp_full resnet50, batch 128 | {} | {} s | {} s | {} / {} |", lambda: _gc_row(RESNET)),
    (README_27, "| fsdp_full resnet50, batch 128, batch norm per layer | {} | {} s | {} s | {} / {} |",
     lambda: _gc_row(RESNET + "-batch_norm_units_per_layer")),
    (README_27, "took {}-{}% of the excess", _gc_share),
    ("docs/gpu.md", "0.19-0.25 s, {}-{}% of each such step's excess", _gc_share),
    (README_27, "`sdpa_causal` (no mask decided from tensor values, so no host read per forward) is {}x `sdpa`\n"
                "  on the window and {}x on the median step",
     lambda: [f"{tokens(rec27(SDPA + '_causal')) / tokens(rec27(SDPA)):.2f}",
              f"{median_sps(rec27(SDPA + '_causal')) / median_sps(rec27(SDPA)):.2f}"]),
    (README_27, "DDP {} samples/s; FSDP2 with its batch norms in one fp32 unit\n  {} ({} on the median step",
     lambda: [f"{sps(rec27('CA/runs/ddp-resnet50-bf16-global_batch_128')):,.0f}", f"{sps(rec27(RESNET)):,.0f}",
              f"{median_sps(rec27(RESNET)):,.0f}"]),
    (README_27, "runner {} against the bare loop's {} samples/s,\n  **{}** ({} on the median step)",
     lambda: [f"{o['runner_samples_per_s']:.2f}", f"{o['bare_samples_per_s']:.2f}", f"{o['ratio']:.3f}",
              f"{o['ratio_median_step']:.3f}"] if (o := json.loads((H200_27 / "O" / "runner_overhead_0.json").read_text())) else []),
]


def _records27() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(H200_27.glob("*/runs/*/result.json"))]


def _estimate_errors() -> list[str]:
    """docs/gpu.md's memory-estimator ranges from table.json (benchmarks/gpu_table.py over the records)."""
    rows = [r for r in json.loads((H200_27 / "table.json").read_text()) if r.get("error") is not None]

    def pct(x: float) -> str:
        return f"{100 * x:+.1f}%".replace("+-", "-")
    dense = [r["error"] for r in rows if r["setting"].startswith("T=") and "experts" not in r["setting"]]
    short = [e for r, e in zip([r for r in rows if r["setting"].startswith("T=") and "experts" not in r["setting"]],
                               dense) if int(r["setting"][2:].split(",")[0]) <= 16384]
    at32 = {r["setting"].split("ac=")[1].split(",")[0]: r["error"] for r in rows
            if r["setting"].startswith("T=32768") and "ac=" in r["setting"]}
    moe = [r["error"] for r in rows if "experts" in r["setting"]]
    resnet = {r["framework"]: r["error"] for r in rows if "batch norm" in r["setting"] or r["setting"] == "mb None/128"}
    return [str(len(rows)), pct(min(short)).lstrip("+"), pct(max(short)), pct(at32["selective_op"]).lstrip("+"),
            pct(at32["full"]).lstrip("+"), pct(min(moe)).lstrip("+"), pct(max(moe)), pct(resnet["fsdp2:full_shard"]).lstrip("+"),
            pct(resnet["ddp:default"])]


def _energy27() -> list[str]:
    ok = [r for r in _records27() if r["status"] == "ok"]
    assert all((r.get("gpu") or {}).get("energy_per_sample_j") for r in ok)     # "all": every ok record has it
    return [str(len(ok))]


def _peaks27() -> list[str]:
    by_session = {}
    for r in _records27():
        peak = (r.get("flops") or {}).get("measured_peak_per_device")
        if peak:
            by_session.setdefault(r["env"]["git_sha"][:7], set()).add(f"{peak / 1e12:.1f}")
    first, second = by_session["471ae85"], by_session["b755877"]
    assert len(first) == len(second) == 1, by_session      # one measured peak per session
    return [first.pop(), second.pop()]


CLAIMS += [
    ("docs/gpu.md", "(reports/gpu-h200/2026-11-27/table.md, the {} records with an estimate): the dense language runs up\n"
                    "  to 16k tokens {}..{}; at 32k {} (`selective_op`) and {} (`full`); the MoE models\n"
                    "  {} (the per-expert loop under DDP) to {}; ResNet-50 {} under FSDP2 and **{} under\n  DDP**",
     _estimate_errors),
    ("docs/gpu.md", "it is in all {} ok records of 2026-11-27 on an H200", _energy27),
    (README_27, "CUDA-event probe, best of n = 4096, 8192, 16384): {} TFLOP/s in every record of M, L and X (the\n"
                "first session), {} in C and CA (the second)", _peaks27),
]


PIECES = REPO / "reports" / "pieces-check" / "2026-11-27"


def _pieces_row(framework: str) -> list[str]:
    """docs/projection.md's calibrate=pieces check: both invocations' row of one framework."""
    runs = [next(r for r in json.loads((PIECES / f"run{i}.json").read_text()) if r["framework"] == framework)
            for i in (1, 2, 3)]
    ms = [lambda r: f"{1e3 * r['predicted']['step_s']:.1f}", lambda r: f"{1e3 * r['predicted']['optimizer_s']:.1f}",
          lambda r: f"{r['predicted']['factor']:.3f}", lambda r: f"{1e3 * r['measured']['median_step_s']:.1f}",
          lambda r: f"{100 * r['error_vs_median']:+.1f}%"]
    return [framework] + [f(r) for f in ms for r in runs]


CLAIMS += [("docs/projection.md", "| {} | {} / {} / {} | {} / {} / {} | {} / {} / {} | {} / {} / {} | {} / {} / {} |",
            lambda fw=fw: _pieces_row(fw)) for fw in ("ddp", "fsdp_full", "deepspeed_zero2", "fsdp_grad_op")]


def _pieces_row_at_2(framework: str) -> list[str]:
    """docs/projection.md's calibrate=pieces check at 2 ranks: the framework's row."""
    r = next(r for r in json.loads((PIECES / "ranks2.json").read_text()) if r["framework"] == framework)
    p, m = r["predicted"], r["measured"]
    return [framework, f"{1e3 * p['step_s']:.1f}", f"{1e3 * p['optimizer_s']:.1f}", f"{1e3 * p['exposed_comm_s']:.1f}",
            f"{p['factor']:.3f}", f"{1e3 * m['median_step_s']:.1f}", f"{100 * r['error_vs_median']:+.1f}%"]


CLAIMS += [("docs/projection.md", "| {} | {} | {} | {} | {} | {} | {} |", lambda fw=fw: _pieces_row_at_2(fw))
           for fw in ("ddp", "fsdp_full", "deepspeed_zero2", "fsdp_grad_op")]


def _fake_worlds() -> list[str]:
    rows = {r["framework"]: r["fake_worlds_step_s"] for r in json.loads((PIECES / "run3.json").read_text())}
    return [f"{1e3 * v:.1f}" for fw in ("fsdp_full", "fsdp_grad_op", "deepspeed_zero2", "ddp") for v in rows[fw].values()]


CLAIMS += [("docs/projection.md", "ms at 1 / 2 / 8 / 64 ranks: FSDP2 {} / {} /\n{} / {}, grad-op {} / {} / {} / {}, "
            "ZeRO-2 {} / {} / {} / {}, DDP {} / {} / {} /\n{}", _fake_worlds)]


GRID = REPO / "reports" / "advise-eval" / "gpt2_tiny_default_grid"
GRID_RUNS = ("before-own-collectives", "run1", "run2")


def _advice(run: str) -> dict:
    return json.loads((GRID / run / "advice.json").read_text())


def _ranked(state: dict) -> list[dict]:
    return sorted((c for c in state["candidates"] if c.get("rank")), key=lambda c: c["rank"])


def _grid_row(what: str) -> list[str]:
    """docs/advise-evaluation.md's default-grid table: one row, every invocation's value."""
    out = []
    for run in GRID_RUNS:
        s = _advice(run)
        ev, ranked = s["evaluation"], _ranked(s)
        best = next(c for c in ranked if c["label"] == ev["best"])
        hv = next(c for c in ranked if c["label"] == "horovod dp2 mb4x1")
        own = [c for c in s["calibration"]["cells"] if c.get("own_collectives")]
        ordinal = {1: "1st", 2: "2nd", 3: "3rd"}
        if what == "regret":
            out += [f"{ev['regret'][k]:.3f}" for k in ("1", "3", "5")]
        elif what == "best":
            out += [f"{1e3 * ev['best_measured']:.1f}", ordinal.get(best["rank"], f"{best['rank']}th")]
        elif what == "tau":
            out += [f"{ev['kendall_tau_b']:.2f}", *(f"{x:.2f}" for x in ev["kendall_tau_b_interval"])]
        elif what == "spread":
            out += [f"{ev['spread']:.2f}"]
        elif what == "cost":
            c = ev["cost"]
            out += [f"{c['advice_device_s']:.0f}", f"{c['grid_device_s']:.0f}", f"{100 * c['advice_over_grid']:.0f}"]
        elif what == "own" and own:
            out += [f"{1e3 * own[0]['comm_measured_s']:.1f}", f"{1e3 * own[0]['comm_priced_s']:.1f}",
                    f"{s['calibration']['comm_factor']['horovod']:.2f}"]
        elif what == "horovod":
            label = "1st predicted" if hv["rank"] == 1 else ordinal.get(hv["rank"], f"{hv['rank']}th")
            out += [f"{1e3 * hv['predicted']['step_s']:.1f}", f"{1e3 * hv['measured']['step_s']:.1f}", label]
    return out


EVAL_DOC = "docs/advise-evaluation.md"
CLAIMS += [
    (EVAL_DOC, "| regret@1 / @3 / @5 | **{}** / {} / {} | **{}** / {} / {} | **{}** / {} / {} |", lambda: _grid_row("regret")),
    (EVAL_DOC, "| the grid's best, measured | {} ms ({} predicted) | {} ms ({} predicted) | {} ms ({} predicted) |",
     lambda: _grid_row("best")),
    (EVAL_DOC, "| Kendall τ-b [95% bootstrap] | {} [{}, {}] | {} [{}, {}] | {} [{}, {}] |", lambda: _grid_row("tau")),
    (EVAL_DOC, "| grid spread (slowest / fastest) | {} | {} | {} |", lambda: _grid_row("spread")),
    (EVAL_DOC, "| cost to find | {} of {} device-s ({}%) | {} of {} device-s ({}%) | {} of {} device-s ({}%) |",
     lambda: _grid_row("cost")),
    (EVAL_DOC, "| Horovod's collectives: measured beyond compute / priced | - | {} / {} ms (x{}) | {} / {} ms (x{}) |",
     lambda: _grid_row("own")),
    (EVAL_DOC, "| horovod dp2 mb4x1: predicted / measured | {} / {} ms ({}) | {} / {} ms ({}) | {} / {} ms ({}) |",
     lambda: _grid_row("horovod")),
    (EVAL_DOC, "(mb1x4 {} / {}\npredicted, {} / {} measured)", lambda: [
        f"{1e3 * next(c for c in _ranked(_advice(r)) if c['label'] == 'horovod dp2 mb1x4')[k]['step_s']:.1f}"
        for k in ("predicted", "measured") for r in ("run1", "run2")]),
]


def _repeated() -> dict:
    return _advice("repeated")


def _repeated_row(what: str) -> list[str]:
    import statistics
    s = _repeated()
    ev, rec = s["evaluation"], s["recommendation"]
    ran = [c for c in s["candidates"] if c.get("runs")]
    if what == "runs":
        return [str(ev["candidates"]), str(ev["grid_runs"])]
    if what == "best":
        return [ev["best"], f"{1e3 * ev['best_measured']:.1f}"]
    if what == "regret":
        return [f"{ev['regret'][k]:.3f}" for k in ("1", "3", "5")]
    if what == "interval":
        return [f"{ev['regret_of_recommendation']:.3f}", *(f"{x:.3f}" for x in ev["regret_of_recommendation_interval"])]
    if what == "margin":
        c = rec["comparison"]
        return [f"{c['ratio']:.2f}", f"{c['low']:.2f}", f"{c['high']:.2f}", rec["runner_up"], f"{c['p']:.3f}",
                str(c["runs"][0]), str(c["runs"][1])]
    if what == "tau":
        return [f"{ev['kendall_tau_b']:.2f}", *(f"{x:.2f}" for x in ev["kendall_tau_b_interval"])]
    if what == "spread":
        return [f"{ev['spread']:.2f}"]
    if what == "own":
        spreads = [max(r["step_s"] for r in c["runs"]) / min(r["step_s"] for r in c["runs"]) for c in ran]
        return [f"{statistics.median(spreads):.2f}", f"{max(spreads):.2f}"]
    cost = ev["cost"]
    return [f"{cost['advice_device_s']:.0f}", f"{cost['grid_device_s']:.0f}", f"{100 * cost['advice_over_grid']:.0f}"]


CLAIMS += [(EVAL_DOC, text, lambda w=what: _repeated_row(w)) for what, text in (
    ("runs", "| candidates, runs each | {}, {} |"),
    ("best", "| the grid's best (median of its runs) | {}, {} ms |"),
    ("regret", "| regret@1 / @3 / @5 | {} / {} / {} |"),
    ("interval", "| regret of the recommendation [95% bootstrap] | {} [{}, {}] |"),
    ("margin", "| the recommendation's margin (the verdict rule) | {}x [{}, {}] over {}, rank-sum p={} over {}+{} "
               "interleaved runs |"),
    ("tau", "| Kendall τ-b [95% bootstrap] | {} [{}, {}] |"),
    ("spread", "| grid spread (slowest / fastest) | {} |"),
    ("own", "| a candidate's own runs, slowest / fastest: median, worst | {}, {} |"),
    ("cost", "| cost to find (the grid: 3 runs each) | {} of {} device-s ({}%) |"))]


LAYOUT = REPO / "reports" / "network" / "layout-check"


def _layout_errors(run: str = "", name: str = "layout_check.json") -> list[float]:
    return [r["prediction"]["error"] for d in (LAYOUT / "one-per-node" / run, LAYOUT / run)
            for r in json.loads((d / name).read_text())["rows"]]


def _within(run: str = "", name: str = "layout_check.json") -> list[str]:
    errs = _layout_errors(run, name)
    return [str(sum(abs(e) <= 0.10 for e in errs)), str(len(errs)), f"{100 * sum(map(abs, errs)) / len(errs):.1f}"]


CLAIMS += [
    ("README.md", "2-D layouts: {} of {} layouts within 10%", lambda: _within()[:2]),
    ("docs/projection.md", "both shapes: **{} of {} layouts within 10%, mean |error| {}%**", _within),
    ("docs/projection.md", "`one-per-node/run2/`): {} of {} within 10%, mean |error| {}%", lambda: _within("run2")),
    ("docs/projection.md", "`run1/` both shapes: {} of {} within 10%, mean |error| {}%", lambda: _within("run1")),
    ("docs/projection.md", "`run3/` both shapes: {} of {} within 10%, mean |error| {}%", lambda: _within("run3")),
    ("docs/projection.md", "`run4/` both shapes: {} of {} within 10%, mean |error| {}%", lambda: _within("run4")),
    ("docs/projection.md", "the same runs were\n{} of {} within 10% (`as-run.json`",
     lambda: _within(name="as-run.json")[:2]),
    ("docs/projection.md", "mean |error| 4.8%\n({} of {} as run too)", lambda: _within("run4", "as-run.json")[:2]),
]


def _nemo_moe() -> list[str]:
    """NeMo Automodel's rows (DeepSeek-V3, Kimi K2, GPT-OSS) as docs/projection.md's prose quotes them."""
    doc = json.loads((REPO / "reports" / "published" / "nemo_automodel_h100_2025-10.json").read_text())
    r, pair = {row["id"]: row for row in doc["rows"]}, doc["pairs"][0]["error"]
    pct = [f"{100 * r[i]['error']:+.1f}%" for i in ("ds_v3_256", "ds_v3_1024", "kimi_k2_256", "gpt_oss_20b_8",
                                                      "gpt_oss_120b_64")]
    return [*pct, f"{100 * pair:+.1f}%", f"{r['ds_v3_256']['predicted_memory_gib']:.1f}",
            f"{r['ds_v3_1024']['predicted_memory_gib']:.1f}", f"{100 * r['ds_v3_256']['efficiency']:.1f}%"]


def _nemo_calibration() -> list[str]:
    """The calibration row's own projection (reports/published/nemo_qwen3_moe_30b_8_calibration.json)."""
    doc = json.loads((REPO / "reports" / "published" / "nemo_qwen3_moe_30b_8_calibration.json").read_text())
    row = doc["rows"][0]
    return [f"{100 * doc['efficiency']:.1f}%", f"{1e3 * row['exposed_by_kind_s']['all_to_all@nvlink']:,.1f}"]


CLAIMS += [("docs/projection.md", "It calibrates the stack at {} of the H100's\npeak", lambda: _nemo_moe()[8:]),
           ("docs/projection.md", "**DeepSeek-V3 {} (256 GPUs) and {} (1,024), Kimi K2 {},\nGPT-OSS-20B {} and "
            "GPT-OSS-120B {}; the 1,024 / 256 pair {}**", lambda: _nemo_moe()[:6]),
           ("docs/projection.md", "Memory: {} GiB (256) and {} (1,024) predicted", lambda: _nemo_moe()[6:8]),
           ("docs/projection.md", "with compute at {} of the H100's peak (plausible: under the 85% bound), of which\n{} ms",
            _nemo_calibration)]


LENGTH = REPO / "reports" / "length-check" / "2026-11-28.json"


def _length_rows() -> list[dict]:
    return json.loads(LENGTH.read_text())["rows"]


def _length_within(count: str) -> list[str]:
    errs = [abs(r[f"error_{count}"]) for r in _length_rows()]
    return [str(sum(e <= 0.10 for e in errs)), str(len(errs)), f"{100 * sum(errs) / len(errs):.1f}"]


CLAIMS += [
    ("README.md", "a longer sequence's rate predicted from the shortest run's within 10% in {} of {}\ncases",
     lambda: _length_within("causal")[:2]),
    ("docs/projection.md", "{} of {} within 10% (mean |error| {}%) against {} of {} ({}%)",
     lambda: _length_within("causal") + _length_within("full")),
]


# 2026-11-30 (steps G and P): the collector frozen against Python's, and llama_8b's pieces
H200_30 = REPO / "reports" / "gpu-h200" / "2026-11-30"
README_30 = "reports/gpu-h200/2026-11-30/README.md"
G_LLAMA = "G/runs/fsdp_full-llama_1b-bf16-micro_batch_2-attention_sdpa-min_window_s_10-timeout_s_80"
G_RESNET = "G/runs/fsdp_full-resnet50-bf16-global_batch_128-min_window_s_10-timeout_s_80"

rec30 = partial(record_in, H200_30)


def _g_row(path: str) -> list[str]:
    """Measured steps, median, window mean, slowest step (its excess, the GC in it), collections, GC s, throughput."""
    r = rec30(path)
    t, h = r["timing"], r["timing"]["host_events"]
    gc, slow = h["per_rank"][0]["gc"], h["slowest_step"]
    rate = f"{tokens(r):,.0f} tokens/s" if r["throughput"].get("tokens_per_s") else f"{sps(r):,.0f} samples/s"
    return [str(t["measured_steps"]), f"{t['step_time_s']['median']:.4f}", f"{t['window_step_s']:.4f}",
            f"{slow['step_s']:.4f}", f"{slow['over_median_s']:.3f}", f"{slow['gc_s']:.3f}",
            *(str(gc["collections"][g]) for g in "012"), f"{gc['seconds']:.3f}", rate]


def _g_ratio(path: str, of) -> str:
    return f"{of(rec30(path)) / of(rec30(path + '-gc_python')):.3f}"


def _p_projection(call: str) -> dict:
    return json.loads((H200_30 / call / "projections" / "0" / "projection.json").read_text())


CLAIMS += [
    (README_30, "| llama_1b, micro-batch 2 x 4 accumulated, `attention=sdpa` | freeze | {} | {} s | {} s | {} s ({} s; {} s) "
                "| {} / {} / {} | {} | {} |", lambda: _g_row(G_LLAMA)),
    (README_30, "| the same | python | {} | {} s | {} s | {} s ({} s; **{} s**) | {} / {} / {} | {} | {} |",
     lambda: _g_row(G_LLAMA + "-gc_python")),
    (README_30, "| resnet50, batch 128 | freeze | {} | {} s | {} s | {} s ({} s; {} s) | {} / {} / {} | {} | {} |",
     lambda: _g_row(G_RESNET)),
    (README_30, "| the same | python | {} | {} s | {} s | {} s ({} s; **{} s**) | {} / {} / {} | {} | {} |",
     lambda: _g_row(G_RESNET + "-gc_python")),
    (README_30, "**llama_1b: {}x on the window**", lambda: [_g_ratio(G_LLAMA, tokens)]),
    (README_30, "**ResNet-50: {}x on the window, but not from GC alone.** Its medians differ by {}%",
     lambda: [_g_ratio(G_RESNET, sps), f"{100 * (float(_g_ratio(G_RESNET, median_sps)) - 1):.1f}"]),
    (README_30, "Its medians differ by {}% (0.4314 / 0.4412)",
     lambda: [f"{100 * (float(_g_ratio(G_LLAMA, median_sps)) - 1):.1f}"]),
    ("docs/gpu.md", "llama_1b 1.045x\non the window ({} against {} tokens/s), ResNet-50 {}x",
     lambda: [f"{tokens(rec30(G_LLAMA)):,.0f}", f"{tokens(rec30(G_LLAMA + '-gc_python')):,.0f}",
              _g_ratio(G_RESNET, sps)]),
    (README_30, "(`world_sizes=[8,128,1024]`, `network=dgx_h100 hardware=H200`, `ac=selective_op`, without the\n"
                "framework's factor): {} / {} / {} tokens/s a device, {}% / {}% / {}% MFU, memory\n{} / {} / {} GB a rank",
     lambda: [*(f"{r['tokens_per_s_per_device']:,.0f}" for r in _p_projection("P2")["rows"]),
              *(f"{100 * r['mfu']:.1f}" for r in _p_projection("P2")["rows"]),
              *(f"{r['memory_per_rank_bytes'] / 1e9:.1f}" for r in _p_projection("P2")["rows"])]),
]

def test_the_length_check_table_is_the_report():
    """docs/projection.md's sequence-length table is benchmarks/length_check.py's rows."""
    doc = (REPO / "docs" / "projection.md").read_text()
    for r in _length_rows():
        row = (f"| {r['ac']} | {r['calibrated_on']:,} | {r['seq_len']:,} | {r['measured_tokens_per_s']:,.0f} | "
               f"{r['predicted_causal']:,.0f} ({100 * r['error_causal']:+.1f}%) | "
               f"{r['predicted_full']:,.0f} ({100 * r['error_full']:+.1f}%) |")
        assert row in doc, row


@pytest.mark.parametrize("report", ["layout_check.md", "one-per-node/layout_check.md"])
def test_the_layout_check_tables_are_the_reports(report):
    """docs/projection.md's emulated-cluster tables are benchmarks/layout_check.py's own rows."""
    doc = (REPO / "docs" / "projection.md").read_text()
    rows = [line for line in (LAYOUT / report).read_text().splitlines() if line.startswith("| ")]
    assert rows and all(r in doc for r in rows), [r for r in rows if r not in doc]


B_ROWS = {"fsdp_grad_op": "fsdp_grad_op (FSDP2, reshard_after_forward=False)", "fsdp_full": "fsdp_full (FSDP2)",
          "fsdp_hybrid": "fsdp_hybrid (FSDP2 HSDP)", "deepspeed_zero2": "deepspeed_zero2",
          "deepspeed_zero3": "deepspeed_zero3", "deepspeed_zero1": "deepspeed_zero1", "deepspeed_zero0": "deepspeed_zero0",
          "ddp_bf16_hook": "ddp_bf16_hook", "fsdp_offload": "fsdp_offload (FSDP2, CPU offload)"}


@pytest.mark.parametrize("path,template,values", CLAIMS, ids=[f"{c[0]}: {c[1][:40]}" for c in CLAIMS])
def test_a_claim_says_what_its_record_says(path, template, values):
    text = (REPO / path).read_text()
    claim = template.format(*values())
    assert claim in text, f"{path} should say: {claim!r}"


@pytest.mark.parametrize("framework", list(B_ROWS), ids=list(B_ROWS))
def test_each_step_b_row_says_what_its_record_says(framework):
    """Step B's table: tokens/s, against the fastest eager run, MFU, peak allocated, start-up."""
    toks, vs, m, peak, start = _b_row(framework)
    row = f"| {B_ROWS[framework]} | {toks} | {vs} | {m} | {peak} |"
    text = (REPO / H200_README).read_text()
    assert row in text and f"| {start} |" in text.split(row, 1)[1].splitlines()[0], f"should say: {row} ... {start}"
