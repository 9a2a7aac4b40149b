"""bench advise: the memory estimator and the step-time model by hand, then one end-to-end run
at 2 ranks on gpt2_tiny (grid, pruning with reasons, ranking, top-k measured, advice.json,
heatmap and advice table in the report)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from costs import PROF, cost_of

from ddlbench.adapters.cost import Traffic
from ddlbench.estimate.memory import Layout, estimate
from ddlbench.estimate.step import comm_seconds, predict, spans, step_compute
from ddlbench.metrics.stats import spearman
from ddlbench.network.model import Dimension, Network


def est(layout: Layout, precision: str = "fp32", optimizer: str = "adamw", momentum: float = 0.0, **edits) -> dict:
    """On CPU: PROF has no weight large enough for the optimizer's temporaries to count there."""
    cost = cost_of(layout.framework, layout.dp, layout.tp, layout.pp, layout.micro_batch, layout.grad_accum,
                   precision, **edits)
    return estimate(layout, PROF, cost, optimizer, momentum, device="cpu")


@pytest.mark.parametrize("layout,expected,edits", [
    # AdamW 8 B/param. params, grads, optimizer, activations (mb 2), buffers
    (Layout("ddp", dp=4, micro_batch=2), (4000, 4000, 8000, 2000, 0), {}),
    (Layout("horovod", dp=4, micro_batch=2), (4000, 4000, 8000, 2000, 4000), {}),     # fusion buffer = 4P
    # OSS zeroes gradients in place: every rank keeps all of them
    (Layout("fairscale_oss", dp=4, micro_batch=2), (4000, 4000, 2000, 2000, 0), {}),
    # ZeRO-1/2: the fp32 gradient partition (4 x 1000 / 4) + two full reduce buckets (overlap_comm) of
    # reduce_bucket_size elements, however small the model
    (Layout("deepspeed_zero1", dp=4, micro_batch=2), (4000, 4000, 2000, 2000, 1000 + 2 * 4 * 500),
     {"reduce_bucket_size": 500}),
    (Layout("deepspeed_zero2", dp=4, micro_batch=2), (4000, 1000, 2000, 2000, 1000 + 2 * 4 * 500),
     {"reduce_bucket_size": 500}),
    # ZeRO-3 keeps every gathered parameter from forward to backward (4 x 1000) + one unit's gradients
    # (4 x 200) + one reduce bucket
    (Layout("deepspeed_zero3", dp=4, micro_batch=2), (1000, 1000, 2000, 2000, 4000 + 800 + 4 * 500),
     {"reduce_bucket_size": 500}),
    (Layout("fsdp_full", dp=4, micro_batch=2), (1000, 1000, 2000, 2000, 2 * 2 * 800), {}),
    # shard_grad_op: fp32 shards + every unit gathered from forward to backward (4000) + two units' gradients
    (Layout("fsdp_grad_op", dp=4, micro_batch=2), (1000, 1000, 2000, 2000, 4000 + 2 * 800), {}),
    # hybrid: sharded over groups of 2 (replicated twice), so model state / 2, not / 4
    (Layout("fsdp_hybrid", dp=4, micro_batch=2), (2000, 2000, 4000, 2000, 2 * 2 * 800), {"hybrid_shard_size": 2}),
    # checkpointing: block inputs (100) + one block's full activations (1000 / 4), x mb 2
    (Layout("ddp", dp=4, micro_batch=2, checkpointing=True), (4000, 4000, 8000, 700, 0), {}),
    # tp 2 x dp_shard 2: a 500-parameter slice sharded over 2; activations / tp; one unit 4*200/2
    (Layout("tensor_parallel", dp=2, tp=2, micro_batch=2), (1000, 1000, 2000, 1000, 2 * 2 * 400), {}),
    # pp 2, 4 micro-batches of 2: 1F1B holds pp = 2 in flight, GPipe all 4; p2p: 2 x 2 x 50 x 2
    (Layout("pipeline_1f1b", dp=1, pp=2, micro_batch=2, grad_accum=4), (2000, 2000, 4000, 2000, 400), {}),
    (Layout("pipeline_gpipe", dp=1, pp=2, micro_batch=2, grad_accum=4), (2000, 2000, 4000, 4000, 400), {}),
])
def test_memory_estimate_by_hand(layout, expected, edits):
    got = est(layout, **edits)
    keys = ("params", "grads", "optimizer", "activations", "buffers")
    assert tuple(got[k] for k in keys) == expected
    assert got["total"] == sum(expected) and got["host"] == 0


@pytest.mark.parametrize("layout,expected", [
    # bf16. DDP: fp32 params + grads, autocast's 2-byte weight copies (2P) as a buffer
    (Layout("ddp", dp=4, micro_batch=2), (4000, 4000, 8000, 2000, 2000)),
    # DeepSpeed's bf16 engine: 2-byte params and grads, AdamW + fp32 master copy = 12 B/param sharded;
    # fp32 gradient partition 4P/4 + two reduce buckets of 500 elements in bf16
    (Layout("deepspeed_zero2", dp=4, micro_batch=2), (2000, 500, 3000, 2000, 1000 + 2 * 2 * 500)),
    (Layout("deepspeed_zero3", dp=4, micro_batch=2), (500, 500, 3000, 2000, 2000 + 400 + 2 * 500)),
    # FSDP2: fp32 shards, units gathered in bf16 (2 B x 200)
    (Layout("fsdp_full", dp=4, micro_batch=2), (1000, 1000, 2000, 2000, 2 * 2 * 400)),
])
def test_memory_estimate_at_bf16_by_hand(layout, expected):
    got = est(layout, "bf16", reduce_bucket_size=500) if "deepspeed" in layout.framework else est(layout, "bf16")
    assert tuple(got[k] for k in ("params", "grads", "optimizer", "activations", "buffers")) == expected


def test_memory_estimate_optimizer_and_offload():
    assert est(Layout("ddp", dp=1), optimizer="sgd", momentum=0.9)["optimizer"] == 4000
    assert est(Layout("ddp", dp=1), optimizer="sgd")["optimizer"] == 0
    # ZeRO-3 + offload: parameter, gradient and optimizer shards on the host, the gathered ones on the device
    got = est(Layout("deepspeed_zero3_offload", dp=4, micro_batch=2), reduce_bucket_size=500)
    assert (got["params"], got["grads"], got["optimizer"], got["host"]) == (0, 0, 0, 1000 + 1000 + 2000)
    assert got["total"] == 2000 + 4800 + 4 * 500


def test_step_compute_interpolates_and_adds_bubble_and_recompute():
    calib = {1: 0.03, 5: 0.07}                       # t(m) = 0.02 + 0.01 m
    ddp = cost_of("ddp", dp=2, mb=3, ga=2)
    assert step_compute(Layout("ddp", dp=2, micro_batch=3, grad_accum=2), ddp, calib) == pytest.approx(0.10)
    # pipeline pp 2, 4 micro-batches of 3: (4 + 2 - 1) slots of t(3) / 2
    pipe = cost_of("pipeline_1f1b", dp=1, pp=2, mb=3, ga=4)
    assert step_compute(Layout("pipeline_1f1b", dp=1, pp=2, micro_batch=3, grad_accum=4), pipe, calib) == pytest.approx(0.125)
    # interleaved, 2 stages per rank: the bubble is (pp - 1) / 2 slots
    inter = cost_of("pipeline_interleaved", dp=1, pp=2, mb=3, ga=4)
    assert inter.bubble_slots == 0.5
    tp = cost_of("tensor_parallel", dp=1, tp=2, mb=3)
    assert step_compute(Layout("tensor_parallel", dp=1, tp=2, micro_batch=3), tp, calib, 1.2) == pytest.approx(0.03)
    one = cost_of("ddp", dp=1, mb=4)
    assert step_compute(Layout("ddp", dp=1, micro_batch=4), one, {2: 0.05}) == pytest.approx(0.10)   # one point: proportional
    # ranks sharing cores (CPU): compute stretches by the oversubscription; no network traffic at dp 1
    net = Network("toy", (Dimension("host", 8, 1e9, 1e-3),))
    p = predict(Layout("ddp", dp=1, micro_batch=3, grad_accum=2), cost_of("ddp", dp=1, mb=3, ga=2), calib, net,
                compute_scale=2.0)
    assert p["compute_s"] == pytest.approx(0.20) and p["comm_s"] == 0 and p["step_s"] == pytest.approx(0.20)


def test_a_framework_with_its_own_collectives_is_calibrated_at_the_advices_world():
    """Horovod's collectives bypass c10d: besides its 1-rank cell, one at the advice's devices (at most
    a node's, at least 2) whose step less its compute, over the priced traffic, scales its collectives."""
    from types import SimpleNamespace as NS

    from ddlbench.advise.calibrate import calibration_cells, own_collectives_ranks
    from ddlbench.advise.rank import comm_factor
    cands = [NS(framework=fw, layout=NS(micro_batch=m), plan=NS(variant=NS(abilities=lambda fw=fw: NS(own_collectives=fw == "horovod"))))
             for fw, m in (("ddp", 1), ("ddp", 8), ("horovod", 2), ("horovod", 4), ("fsdp_full", 4))]
    assert calibration_cells(cands, "frameworks", devices=4, per_node=8) == [
        {"framework": "ddp", "micro_batch": 1}, {"framework": "ddp", "micro_batch": 8},
        {"framework": "horovod", "micro_batch": 4},
        {"framework": "horovod", "micro_batch": 4, "ranks": 4, "own_collectives": True},
        {"framework": "fsdp_full", "micro_batch": 4}]
    assert not any(c.get("own_collectives") for c in calibration_cells(cands, "frameworks", devices=1))
    assert len(calibration_cells(cands, "ddp", devices=4)) == 2
    assert [own_collectives_ranks(d, n) for d, n in ((2, 8), (1024, 8), (1, 8), (4, 1))] == [2, 8, 0, 2]
    # 40 ms measured at 2 ranks, 25 of them compute: 15 ms of collectives priced at 5 -> x3
    assert comm_factor(0.040, 0.025, 0.005) == pytest.approx(3.0)
    assert comm_factor(0.020, 0.025, 0.005) == 0.0 and comm_factor(0.040, 0.025, 0.0) == 1.0
    # the factor scales every collective of the prediction, parts too
    net = Network("toy", (Dimension("host", 8, 1e9, 1e-3),))
    calib = {1: 0.1}
    base = predict(Layout("ddp", dp=2, micro_batch=1), cost_of("ddp", dp=2, mb=1), calib, net)
    scaled = predict(Layout("ddp", dp=2, micro_batch=1), cost_of("ddp", dp=2, mb=1), calib, net, comm_scale=3.0)
    assert scaled["comm_s"] == pytest.approx(3 * base["comm_s"]) and scaled["compute_s"] == base["compute_s"]
    assert sum(scaled["comm_parts_s"].values()) == pytest.approx(scaled["comm_s"])


def test_traffic_and_its_time_on_a_network():
    net = Network("toy", (Dimension("host", 8, 1e9, 1e-3),))
    # DDP at dp 2: one all-reduce of Psi = 4000 B (one 25 MiB bucket)
    items = cost_of("ddp", dp=2).traffic
    assert items == (Traffic("all_reduce", 4000.0, 1, 2, 1, "gradients"),)
    t, parts = comm_seconds(items, net, "ring")
    assert t == pytest.approx(2 * 1e-3 + 4000 / 1e9)          # 2(p-1) alpha + 2(p-1)/p B / bw
    # FSDP splits its payload over units (blocks + root = 5 messages of Psi / 5), gathers twice per micro-batch
    items = cost_of("fsdp_full", dp=2, ga=3).traffic
    assert [(c.kind, c.bytes, c.count) for c in items] == [("all_gather", 800.0, 5 * 2 * 3), ("reduce_scatter", 800.0, 5)]
    # hybrid, groups of 2 among 4: gather / reduce-scatter inside a group (adjacent ranks), then the
    # shard (Psi / 2) all-reduced across the 2 groups (ranks 2 apart), each in 5 unit messages
    hyb = cost_of("fsdp_hybrid", dp=4, hybrid_shard_size=2).traffic
    assert [(c.kind, c.bytes, c.count, c.ranks, c.stride) for c in hyb] == [
        ("all_gather", 800.0, 10, 2, 1), ("reduce_scatter", 800.0, 5, 2, 1), ("all_reduce", 400.0, 5, 2, 2)]
    # hybrid with no size given: the node's ranks
    assert cost_of("fsdp_hybrid", dp=4, per_node=2).shard_ranks == 2
    # tp 2: 4 all-reduces of a block's output per block and micro-batch; pp 2: 2 sends per micro-batch
    tp = cost_of("tensor_parallel", dp=1, tp=2, mb=2, ga=3).traffic
    assert [(c.kind, c.bytes, c.count, c.ranks) for c in tp] == [("all_reduce", 100.0, 4 * 4 * 3, 2)]
    pp = cost_of("pipeline_1f1b", dp=1, pp=2, mb=2, ga=3).traffic
    assert [(c.kind, c.bytes, c.count, c.ranks) for c in pp] == [("send", 100.0, 6, 2)]
    assert comm_seconds(pp, net)[0] == pytest.approx(6 * (1e-3 + 100 / 1e9))


def test_group_spans_on_a_two_level_network():
    net = Network("two", (Dimension("nvlink", 8, 1e11, 1e-6), Dimension("ib", 16, 1e10, 1e-5)))
    names = lambda s: [(n, d.name) for n, d in s]   # noqa: E731
    assert names(spans(net, 8, 1)) == [(8, "nvlink"), (1, "ib")]        # tp 8 inside a node
    assert names(spans(net, 4, 8)) == [(1, "nvlink"), (4, "ib")]        # dp 4 across nodes, tp 8
    assert names(spans(net, 16, 1)) == [(8, "nvlink"), (2, "ib")]
    assert names(spans(net, 2, 4)) == [(2, "nvlink"), (1, "ib")]
    with pytest.raises(ValueError, match="exceed"):
        spans(net, 200, 1)


def test_spearman_by_hand():
    assert spearman([1, 2, 3], [10, 30, 20]) == pytest.approx(0.5)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


@pytest.fixture(scope="module")
def advised(tmp_path_factory):
    from conftest import bench, for_runs
    out = tmp_path_factory.mktemp("advise") / "adv"
    proc = bench("advise", "model=gpt2_tiny", "devices=2", "global_batch=8", "micro_batches=[1,4,8]",
                 "frameworks=ddp,fairscale_oss,tensor_parallel,pipeline_1f1b", "budget_runs=3", "repeats=2",
                 "device_memory_gib=1000", f"dir={out}", "run.warmup_steps=1", "run.measure_steps=4",
                 "run.progress=false", "logger=none",
                 # calibration: DDP at 2 micro-batches, 3 frameworks once, the recompute; 3 candidates and at
                 # most 3 repeats: 15 runs at most (advise.rounds: every repeat needs a run below `repeats`)
                 timeout=for_runs(15))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc, json.loads((out / "advice.json").read_text())


@pytest.mark.slow
def test_advise_end_to_end(advised):
    out, proc, state = advised
    cands = state["candidates"]
    assert state["phase"] == "done"
    # the grid: every framework, both micro-batches, checkpointing where the framework has it
    labels = {c["label"] for c in cands}
    assert {"ddp dp2 mb1x4", "ddp dp2 mb4x1 ckpt", "fairscale_oss dp2 mb4x1", "tensor_parallel dp1 tp2 mb4x2",
            "pipeline_1f1b dp1 pp2 mb1x8"} <= labels
    assert not any("fairscale" in c["label"] and "ckpt" in c["label"] for c in cands)   # no such option
    # pruned with the validation's own reason (1F1B: micro-batches >= pp; 8 / 8 = 1 < 2); every
    # pruned candidate says why
    pruned = [c for c in cands if c["pruned"]]
    assert [c["pruned"] for c in pruned if c["label"] == "pipeline_1f1b pp=2 dp=1 micro_batch=8"] == [
        "invalid: schedule 1f1b needs micro-batches >= pipeline ranks: 1 < pp 2"]
    assert all(c["pruned"].split(":")[0] in ("invalid", "unsupported", "topology", "memory") for c in pruned)
    # ranked by predicted step time; the top 3 measured, each with both errors
    ranked = sorted((c for c in cands if c.get("rank")), key=lambda c: c["rank"])
    steps = [c["predicted"]["step_s"] for c in ranked]
    assert steps == sorted(steps) and len(ranked) == sum(1 for c in cands if not c["pruned"])
    measured = [c for c in cands if c.get("measured")]
    assert sorted(c["rank"] for c in measured) == [1, 2, 3]
    for c in measured:
        m = c["measured"]
        assert m["status"] == "ok", m
        assert m["step_error"] == pytest.approx((c["predicted"]["step_s"] - m["step_s"]) / m["step_s"])
        # CPU: host RSS is measured, device memory estimated; no "error" between the two
        assert m["memory_bytes"] > 0 and m["memory_kind"] == "host_rss" and "memory_error" not in m
    # the recommendation is the fastest measured (median over its runs), with the command that reproduces it
    best = min(measured, key=lambda c: c["measured"]["step_s"])
    rec = state["recommendation"]
    assert rec["id"] == best["id"]
    assert "recommendation: " + best["label"] in proc.stdout
    # the two best measured twice (repeats=2), the third once: two runs each cannot pass the rank-sum test
    # (ddlbench.metrics.compare needs 3+), so the answer is a tie that names them and says why
    two = sorted(measured, key=lambda c: c["measured"]["step_s"])[:2]
    assert [c["measured"]["runs"] for c in two] == [2, 2] and len(best["runs"]) == 2
    assert best["measured"]["step_s"] == pytest.approx(sum(best["measured"]["step_s_runs"]) / 2)
    # how many rounds it takes is the noise's to decide: every path names its rounds in turn, each
    # later round only repeats measured candidates, and none is measured more than `repeats` times
    dirs = [r["dir"] for r in state["rounds"]]
    assert dirs == ["measure"] + [f"measure-{i}" for i in range(2, len(dirs) + 1)] and len(dirs) >= 2
    assert all(n >= 1 for r in state["rounds"][1:] for _, n in r["cells"])
    assert all(len(c.get("runs") or ()) <= 2 for c in cands)
    assert rec["runner_up"] == two[1]["label"] and rec["spread"] is not None
    assert not rec["settled"] and rec["tie"][:2] == [best["label"], two[1]["label"]]
    assert rec["comparison"]["runs"] == [2, 2] and "2 and 2 runs: too few" in rec["comparison"]["why"]
    assert "no clear winner: " + ", ".join(rec["tie"]) in proc.stdout
    assert "bench run " + " ".join(best["overrides"]) in proc.stdout
    assert state["rank_correlation"] is None or -1 <= state["rank_correlation"] <= 1
    # the calibration: 1-rank DDP at the smallest and largest micro-batch (the compute line), every
    # other framework once at 1 rank (its factor over DDP, its runtime memory); checkpointing's recompute
    cal = state["calibration"]
    assert sorted(cal["ddp_step_s"]) == ["1", "8"]
    assert cal["compute_factor"]["ddp"] == pytest.approx(1.0)
    ran = {c["framework"] for c in cal["cells"]}
    assert ran | set(cal["skipped"]) == {"ddp", "fairscale_oss", "tensor_parallel", "pipeline_1f1b"}
    assert set(cal["compute_factor"]) == set(cal["runtime_overhead_bytes"]) == ran - set(cal["skipped"])
    assert cal["recompute"] > 1
    for c in measured:      # the framework's own factor and memory overhead went into its figures
        fw = c["framework"]
        assert c["memory_estimate"]["with_overhead"] == c["memory_estimate"]["total"] + cal["runtime_overhead_bytes"].get(
            fw, cal["runtime_overhead_bytes"]["ddp"])


@pytest.mark.slow
def test_advise_memory_pruning_and_verify(advised):
    """The same calibration with a device limit between the estimates: candidates above it are
    pruned with the estimate, the rest ranked; verify_pruned marks the nearest pruned one."""
    import copy

    from ddlbench.advise.command import _results
    from ddlbench.advise.rank import rank_candidates
    from ddlbench.advise.state import Advice
    out, _, state = advised
    state = Advice.from_json(copy.deepcopy(state))
    calib = _results(out / "calibration")
    for c in state.candidates:
        for k in ("rank", "measure", "predicted", "pruned_by_memory", "verify_pruned"):
            c.pop(k, None)
        if (c["pruned"] or "").startswith("memory"):
            c["pruned"] = None
    totals = sorted(c["memory_estimate"]["with_overhead"] for c in state.candidates if c["layout"] and not c["pruned"])
    state.device_memory_bytes = (totals[0] + totals[-1]) // 2
    state.options["verify_pruned"] = 1
    rank_candidates(state, calib)
    over = [c for c in state.candidates if c.get("pruned_by_memory")]
    kept = [c for c in state.candidates if c.get("rank")]
    assert over and kept
    assert all(c["memory_estimate"]["with_overhead"] > state.device_memory_bytes for c in over)
    assert all(c["memory_estimate"]["with_overhead"] <= state.device_memory_bytes for c in kept)
    assert all(c["pruned"].startswith("memory: estimated") for c in over)
    verify = [c for c in over if c.get("verify_pruned")]
    assert len(verify) == 1 and verify[0]["measure"]
    assert verify[0]["memory_estimate"]["with_overhead"] == min(c["memory_estimate"]["with_overhead"] for c in over)


@pytest.mark.slow
def test_advise_report_has_heatmap_and_advice_table(advised):
    from conftest import bench
    out, _, state = advised
    proc = bench("report", str(out), "-o", str(out / "report"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "report" / "best.png").stat().st_size > 0
    md = (out / "report" / "report.md").read_text()
    assert "## Advice: predicted vs measured" in md
    for c in state["candidates"]:
        if c.get("measured"):
            assert f"| {c['rank']} | {c['label']} |" in md
    assert "![best](best.png)" in md


def test_advise_rejects_bad_input():
    from ddlbench.advise.options import parse
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="devices= is required"):
        parse(["model=gpt2_tiny"])
    with pytest.raises(ConfigError, match="unknown option 'colour'"):
        parse(["model=gpt2_tiny", "devices=2", "colour=red"])
    with pytest.raises(ConfigError, match="no framework config nosuch"):
        parse(["model=gpt2_tiny", "devices=2", "frameworks=ddp,nosuch"])
    with pytest.raises(ConfigError, match="budget_runs must be an integer"):
        parse(["model=gpt2_tiny", "devices=2", "budget_runs=many"])
    opts, extra = parse(["model=gpt2_tiny", "devices=2", "run.measure_steps=3", "logger=none"])
    assert extra == ["run.measure_steps=3", "logger=none"] and opts["backend"] == "local"


def test_collect_recommends_the_first_to_reach_the_target_when_there_is_one():
    """With a quality target (experiment=), time to target decides, not the step time; without,
    the fastest measured step. Errors and the rank correlation come from the same records."""
    from ddlbench.advise.conclude import collect, fold
    from ddlbench.advise.state import Advice

    def cand(i, pred):
        return {"id": f"c{i}", "label": f"x{i}", "framework": "ddp", "overrides": [f"o{i}"], "measure": True,
                "rank": i, "predicted": {"step_s": pred}, "memory_estimate": {"with_overhead": 100}}

    def rec(step, ttt):
        return {"status": "ok", "timing": {"step_time_s": {"median": step}}, "throughput": {"samples_per_s": 8 / step},
                "memory": {"per_rank": [{"peak_allocated_bytes": 80}]}, "convergence": {"time_to_target_s": ttt}}
    state = Advice(candidates=[cand(1, 0.1), cand(2, 0.2), cand(3, 0.3)])
    fold(state, ["c1", "c2", "c3"], [rec(0.1, 9.0), rec(0.3, 5.0), rec(0.2, 7.0)])
    collect(state)
    assert state.recommendation["id"] == "c2" and state.recommendation["by"] == "time_to_target_s"
    assert state.rank_correlation == pytest.approx(0.5)       # predicted 1,2,3 vs measured 1,3,2
    m = state.candidates[0]["measured"]
    assert m["step_error"] == pytest.approx(0.0) and m["memory_error"] == pytest.approx(0.25)   # (100 - 80) / 80
    state = Advice(candidates=[cand(1, 0.1), cand(2, 0.2)])
    fold(state, ["c1", "c2"], [rec(0.1, None), rec(0.3, 5.0)])
    collect(state)
    assert state.recommendation["id"] == "c1" and state.recommendation["by"] == "step_s"
    # advice.json round-trips through the typed state; a field this version does not know is refused
    assert Advice.from_json(state.to_json()) == state
    with pytest.raises(ValueError, match="colour"):
        Advice.from_json({**state.to_json(), "colour": "red"})
    # a malformed candidate or round is refused by name, not a KeyError in a later phase (issue 66)
    broken = state.to_json()
    del broken["candidates"][1]["label"]
    with pytest.raises(ValueError, match=r"candidates\[1\]\.label must be a JSON string, got nothing"):
        Advice.from_json(broken)
    with pytest.raises(ValueError, match=r"candidates\[0\] must be a JSON object"):
        Advice.from_json({**state.to_json(), "candidates": ["c1"]})
    with pytest.raises(ValueError, match=r"rounds\[0\]\.cells holds \['c9', 0\]"):
        Advice.from_json({**state.to_json(), "phase": "measure", "rounds": [{"dir": "measure", "cells": [["c9", 0]]}]})


def test_default_network_and_devices_per_node_follow_the_device():
    """network=auto: gloo's calibration on CPU, a reference NVLink + InfiniBand cluster on GPUs
    (the CPU's gloo figures priced NCCL ~100x too slow); per node: the visible GPUs, so the
    tp <= devices-per-node check holds (local_gloo's 64 switched it off)."""
    from ddlbench.advise.options import default_network, devices_per_node, parse
    from ddlbench.network.model import load
    assert parse(["model=gpt2_tiny", "devices=2"])[0]["network"] == "auto"
    assert default_network("cpu", {}) == "local_gloo" and default_network("cuda", {}) == "dgx_h100"
    assert default_network("cpu", {"DDLBENCH_NETWORK": "/x/network.yaml"}) == "/x/network.yaml"   # bench cluster
    gpu_net = load(default_network("cuda"))
    assert gpu_net.dims[0].size == 8 and gpu_net.dims[0].bandwidth / load("local_gloo").dims[0].bandwidth > 100
    assert devices_per_node(None, "cuda", 4, gpu_net) == (4, "GPUs visible on this node")
    assert devices_per_node(2, "cuda", 4, gpu_net) == (2, "devices_per_node")
    assert devices_per_node(None, "cpu", 0, load("local_gloo")) == (64, "network local_gloo")


def test_advise_on_the_local_backend_fails_when_a_cell_left_no_result(tmp_path, capsys):
    """A local calibration sweep has already run when advise reads it: a cell without a result
    crashed (on a GPU: a forked cell that could not use CUDA) - exit 1 and say where, not 0."""
    from ddlbench.advise.command import resume
    from ddlbench.advise.options import ADVICE
    from ddlbench.record.results import atomic_write_json
    from ddlbench.sweep import manifest
    from ddlbench.sweep.cells import Cell
    manifest.create(tmp_path / "calibration", [Cell(index=0, id="c0", overrides=["framework=ddp"], repeat=0)],
                    {"overrides": ["(bench advise)"], "repeats": 1, "backend": "local", "jobs": []})
    state = {"phase": "calibrate", "options": {"backend": "local"}}
    atomic_write_json(tmp_path / ADVICE, state)
    assert resume(tmp_path) == 1
    assert "1 calibration cell(s) ended without a result" in capsys.readouterr().err
    atomic_write_json(tmp_path / ADVICE, {**state, "options": {"backend": "slurm"}})
    assert resume(tmp_path) == 0                      # Slurm: still queued or running, follow it
    assert "calibration not finished" in capsys.readouterr().out


@pytest.mark.slow
def test_advise_evaluate_all_measures_the_grid_and_judges_the_advice(tmp_path):
    """evaluate=all: every candidate measured; the advice (its top budget_runs by prediction) judged by
    its regret against the true best, with what finding it cost against measuring the grid. Horovod,
    whose collectives bypass c10d, is calibrated once more at the advice's 2 ranks: its candidate of
    that very shape is predicted at that run's measured step."""
    from conftest import bench, for_runs

    from ddlbench.advise.command import _results
    out = tmp_path / "ev"
    # the network given as a file (commbench's network.yaml is one), not a conf name: resume finds it
    mine = tmp_path / "fitted.yaml"
    mine.write_text((Path(__file__).parents[1] / "conf/network/local_gloo.yaml").read_text().replace(
        "name: local_gloo", "name: local_gloo_fitted"))
    proc = bench("advise", "model=gpt2_tiny", "devices=2", "global_batch=8", "micro_batches=[4]", f"network={mine}",
                 "frameworks=ddp,horovod", "budget_runs=1", "evaluate=all", "grid_repeats=2", "device_memory_gib=1000",
                 f"dir={out}", "run.warmup_steps=1", "run.measure_steps=3", "run.progress=false", "logger=none",
                 # 4 calibration cells (DDP, its recompute, Horovod at 1 and 2 ranks), 3 candidates twice
                 timeout=for_runs(11))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "horovod mb4 over 2 ranks (its own collectives)" in proc.stdout
    assert "horovod's own collectives at 2 ranks: " in proc.stdout
    state = json.loads((out / "advice.json").read_text())
    assert state["network"] == "local_gloo_fitted" and state["network_source"] == str(mine)
    ranked = sorted((c for c in state["candidates"] if c.get("rank")), key=lambda c: c["rank"])
    # ddp with and without checkpointing, horovod (no checkpointing option)
    assert len(ranked) == 3 and all(c["measured"]["status"] == "ok" for c in ranked)
    # Horovod's own collectives: the 2-rank cell's step less its compute, over the network model's price
    cal = state["calibration"]
    own = [c for c in cal["cells"] if c.get("own_collectives")]
    assert [(c["framework"], c["micro_batch"], c["ranks"]) for c in own] == [("horovod", 4, 2)]
    cal_step = _results(out / "calibration")[cal["cells"].index(own[0])]["timing"]["step_time_s"]["median"]
    assert own[0]["comm_priced_s"] > 0
    assert cal["comm_factor"]["horovod"] == pytest.approx(max(own[0]["comm_measured_s"], 0) / own[0]["comm_priced_s"])
    same = next(c for c in ranked if c["label"] == "horovod dp2 mb4x1")
    p = same["predicted"]
    assert p["comm_s"] == pytest.approx(own[0]["comm_priced_s"] * cal["comm_factor"]["horovod"])
    if own[0]["comm_measured_s"] >= 0:
        assert p["step_s"] == pytest.approx(cal_step)
    ev = state["evaluation"]
    assert ev["candidates"] == ev["feasible"] == 3 and ev["budget"] == 1
    steps = [c["measured"]["step_s"] for c in ranked]
    assert ev["best_measured"] == min(steps) and ev["regret"]["1"] == pytest.approx(steps[0] / min(steps))
    assert ev["best_in_top"]["5"] and ev["regret"]["5"] == 1.0
    assert ev["spread"] == pytest.approx(max(steps) / min(steps))
    assert ev["cost"]["budget_fraction"] == pytest.approx(1 / 3) and ev["cost"]["grid_device_s"] > 0
    # grid_repeats=2: the grid's rounds come after the advice's, each measures every candidate once (A B C
    # A B C), and every candidate ends with its 2 runs
    grid = [r for r in state["rounds"] if r["why"].startswith("the grid")]
    assert grid and state["rounds"][-1] is grid[-1] and grid[-1]["why"] == "the grid, run 2 of each"
    assert all(sorted(i for i, _ in r["cells"]) == sorted(c["id"] for c in ranked) for r in grid)
    assert all(len(c["runs"]) == 2 for c in ranked) and ev["grid_runs"] == 2
    lo, hi = ev["regret_of_recommendation_interval"]
    assert lo <= ev["regret_of_recommendation"] <= hi and lo >= 1.0
    assert f"[{lo:.3f}, {hi:.3f}] over 2+ interleaved runs" in proc.stdout
    # the recommendation is the advice's own (its budget), not the grid's best
    assert state["recommendation"]["id"] == ranked[0]["id"]
    assert "regret @1" in proc.stdout and "cost to find" in proc.stdout


def test_a_model_too_big_for_one_device_is_calibrated_by_a_sharded_run(tmp_path):
    """When the 1-rank DDP calibration would not fit one device (by the estimate), FSDP2 full shard
    over every device measures the compute instead (its step less the communication the network
    model prices), and the advice goes on; before, the advice aborted. The device limit sits
    between DDP's 1-rank estimate and FSDP's 2-rank one (gpt2_tiny, micro-batch 4)."""
    from conftest import bench, for_runs

    from ddlbench.advise.calibrate import calibration_overrides
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import plan_from_overrides

    def est(fw, ranks):
        plan = plan_from_overrides(calibration_overrides(fw, "gpt2_tiny", 4, [], None, ranks))
        prof = profile(plan.cfg.model, plan.cfg.run.precision)
        cost = plan.variant.cost_model(plan.dims, prof, plan.cfg.run.precision, None)
        return estimate(Layout(fw, dp=ranks, micro_batch=4), prof, cost, device="cpu")["total"]
    one, sharded = est("ddp", 1), est("fsdp_full", 2)
    assert sharded < one
    limit_gib = (one + sharded) / 2 / (1 << 30)
    out = tmp_path / "big"
    proc = bench("advise", "model=gpt2_tiny", "devices=2", "global_batch=8", "micro_batches=[4]",
                 "frameworks=ddp,fsdp_full", "budget_runs=1", f"device_memory_gib={limit_gib:.9f}", f"dir={out}",
                 "run.warmup_steps=1", "run.measure_steps=2", "run.progress=false", "logger=none",
                 timeout=for_runs(4))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "over 2 ranks (DDP does not fit one device)" in proc.stdout
    state = json.loads((out / "advice.json").read_text())
    cells = state["calibration"]["cells"]
    assert [(c["framework"], c.get("ranks"), c.get("stands_in_for")) for c in cells] == [("fsdp_full", 2, "ddp")]
    assert "does not fit one device" in state["calibration"]["skipped"]["fsdp_full"]   # its own 1-rank cell
    assert float(state["calibration"]["ddp_step_s"]["4"]) > 0 and cells[0]["comm_s"] > 0
    plain_ddp = [c for c in state["candidates"] if c["framework"] == "ddp" and "checkpointing=true" not in
                 " ".join(c["overrides"])]
    assert plain_ddp and all(c["pruned"].startswith("memory:") for c in plain_ddp)
    assert state["recommendation"] is not None and state["recommendation"]["measured_step_s"] > 0


def test_measured_candidates_spread_over_the_nodes_their_devices_fill():
    """backend=slurm inside `bench cluster` (one core, so one device, per node): 2 devices are
    one Slurm task on each of 2 nodes; 8 devices on nodes of 4, 2 nodes; within one node, or on
    the local back end, the local launcher as before."""
    from ddlbench.advise.calibrate import spread_overrides
    assert spread_overrides(2, 1, "slurm") == ["launcher=slurm", "launcher.nodes=2"]
    assert spread_overrides(8, 4, "slurm") == ["launcher=slurm", "launcher.nodes=2"]
    assert spread_overrides(6, 4, "slurm") == ["launcher=slurm", "launcher.nodes=2"]
    assert spread_overrides(4, 8, "slurm") == [] and spread_overrides(2, 1, "local") == []


def test_a_pipelines_sends_overlap_the_next_micro_batchs_compute():
    """pp 2 over a link: a flow shop. Slot (forward + backward of one micro-batch on a stage) 6 ms,
    one send 11 ms, 8 micro-batches: the link paces them, (8 - 1) x 11 + 2 x 6 + 2 x 11 = 111 ms;
    no overlap would say 9 x 6 + 16 x 11 = 230 ms (measured on the emulated 100 Mbit/s cluster,
    gpt2_tiny mb2x8: 104 ms against this model's 110). Without sends it is the bubble formula,
    (8 + 2 - 1) x 6 = 54 ms; with sends faster than a slot, compute paces them. Through predict:
    a 1F1B candidate on a 1 MB/s link whose activation messages take 2 ms each."""
    from ddlbench.estimate.step import pipeline_step
    assert pipeline_step(0.006, 8, 2, 0.011) == pytest.approx(0.111)
    assert pipeline_step(0.006, 8, 2, 0.0) == pytest.approx(0.054)
    assert pipeline_step(0.006, 8, 2, 0.001) == pytest.approx(7 * 0.006 + 2 * 0.006 + 2 * 0.001)
    assert pipeline_step(0.006, 1, 4, 0.002) == pytest.approx(4 * 0.006 + 6 * 0.002)
    pipe = cost_of("pipeline_1f1b", dp=1, pp=2, mb=3, ga=4)
    assert pipe.pipeline_stages == 2 and cost_of("pipeline_interleaved", dp=1, pp=2, mb=3, ga=4).pipeline_stages == 0
    (send,) = [t for t in pipe.traffic if t.kind == "send"]
    link = Network("link", (Dimension("link", 2, send.bytes / 0.002, 0.0),))
    calib = {1: 0.03, 5: 0.07}                       # t(3) = 0.05: a slot is 0.05 / 2 (half the model)
    lay = Layout("pipeline_1f1b", dp=1, pp=2, micro_batch=3, grad_accum=4)
    p = predict(lay, pipe, calib, link, algorithm="ring")
    assert p["compute_s"] == pytest.approx(0.125) and p["comm_s"] == pytest.approx(send.count * 0.002)
    assert p["step_s"] == pytest.approx(pipeline_step(0.025, 4, 2, 0.002)) == pytest.approx(3 * 0.025 + 0.05 + 0.004)
