"""Mixture-of-Experts models and expert parallelism: FLOPs and parameters by hand, the router's
statistics, the all-to-all's price, bad input refused before any process starts, the dry run at
scale, and real runs: expert parallelism (ep=2, dropless, no load-balancing loss) matches one rank;
the record says what an MoE step did. The equivalence gate (tests/test_equivalence.py) holds EP,
EP x FSDP2 and EP x TP to DDP's losses and final parameters on moe_tiny."""
from __future__ import annotations

import pytest
from conftest import bench, run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides


def _spec(preset: str, *more: str):
    from ddlbench import models
    return models.build(plan_from_overrides([f"model={preset}", *more]).cfg.model)


def test_moe_tiny_active_flops_by_hand():
    """Per token, forward, 2 FLOPs a multiply-add: attention projections 2 x 128 x (2 x 128 + 2 x 64)
    = 98,304 (q and o: 4 heads x 32; k and v: 2 x 32); scores QK^T and AV over T = 128: 4 x 128 x
    128 = 65,536; router 2 x 128 x 8 = 2,048; two experts' SwiGLU 2 x 2 x 3 x 128 x 64 = 98,304.
    Two layers: 528,384; training x3: 1,585,152; lm head 3 x 2 x 128 x 256 = 196,608; 1,781,760 a
    token, x 128 tokens = 228,065,280 a sample. torch's flop counter (meta, uniform routing) agrees."""
    from ddlbench.models.flops import train_flops_per_sample
    f = train_flops_per_sample(_spec("moe_tiny"))
    assert f["analytic"]["train_per_sample"] == 228_065_280
    assert f["flops"] == 228_065_280
    parts = f["analytic"]["parts_per_token"]
    assert parts["router"] == 3 * 2 * 2048 and parts["routed experts"] == 3 * 2 * 98_304
    # parameters: 8 experts of 3 x 128 x 64 per layer, 2 of them used by a token
    experts = 2 * 8 * 3 * 128 * 64
    assert f["params"]["total"] - f["params"]["active"] == experts * 6 // 8


def test_published_shape_counts_active_flops_and_parameters():
    """Qwen3-30B-A3B on meta: 30.5B parameters, 3.35B active (Qwen's model card: 30.5B, 3.3B
    activated); the counted FLOPs equal the analytic active count (within 0.5%: exactly here), held
    at 2 of its 48 layers (the count is the same per layer; the whole model's took 112 s of the suite)."""
    import torch

    from ddlbench.models.flops import train_flops_per_sample
    from ddlbench.models.moe import param_counts
    spec = _spec("qwen3_moe_30b_a3b")
    with torch.device("meta"):
        counts = param_counts(spec.build(), spec.top_k)
    assert counts["total"] == pytest.approx(30.53e9, rel=1e-3)
    assert counts["active"] == pytest.approx(3.353e9, rel=1e-3)
    f = train_flops_per_sample(_spec("qwen3_moe_30b_a3b", "model.n_layer=2"))
    assert f["flops"] == pytest.approx(f["analytic"]["train_per_sample"], rel=0.005)
    # PaLM's 6N uses the active parameters, not all of them (Qwen3-30B-A3B: 32 heads of 128, 4,096 tokens)
    from ddlbench.models.flops import palm_train_flops_per_token
    assert f["params"]["active"] < f["params"]["total"]
    assert f["palm_flops"] == 4096 * palm_train_flops_per_token(f["params"]["active"], 2, 32, 128, 4096)
    # Qwen3-235B-A22B (Megatron-Bridge's published MoE row): 235.1B parameters, 22.2B active (the card: 235B, 22B)
    spec = _spec("qwen3_moe_235b_a22b")
    with torch.device("meta"):
        counts = param_counts(spec.build(), spec.top_k)
    assert counts["total"] == pytest.approx(235.09e9, rel=1e-3) and counts["active"] == pytest.approx(22.19e9, rel=1e-3)


def test_a_shared_expert_family_counts_its_shared_expert():
    """Qwen1.5-MoE-A2.7B (qwen2_moe: 60 fine-grained experts, top-4, a shared expert every token
    uses): 14.3B parameters, 2.69B active (the model card: 14.3B, 2.7B activated); the shared expert
    in the analytic count: 2 x 3 x 128 x 64 + 2 x 128 per token per layer on moe_shared_tiny."""
    import torch

    from ddlbench.models.moe import layer_flops, param_counts
    spec = _spec("qwen1_5_moe_a2_7b")
    with torch.device("meta"):
        counts = param_counts(spec.build(), 4)
    assert counts["total"] == pytest.approx(14.316e9, rel=1e-3) and counts["active"] == pytest.approx(2.689e9, rel=1e-3)
    cfg = plan_from_overrides(["model=moe_shared_tiny"]).cfg.model
    assert layer_flops(cfg)["shared expert"] == 2 * 3 * 128 * 64 + 2 * 128
    with pytest.raises(ConfigError, match="no shared expert"):
        plan_from_overrides(["framework=deepspeed_moe", "model=moe_shared_tiny", "launcher.nproc=2"])
    with pytest.raises(ConfigError, match="family qwen3_moe has no shared expert"):
        plan_from_overrides(["model=moe_tiny", "+model.moe.shared_intermediate_size=64"])


def test_load_summary_by_hand():
    from ddlbench.models.moe import load_summary
    ranks = [{"tokens_per_expert": [[4, 0, 2, 2]], "aux_loss_mean": 1.0},
             {"tokens_per_expert": [[2, 2, 2, 2]], "aux_loss_mean": 3.0}]
    s = load_summary(ranks, ep=2)
    assert s["tokens_per_expert"] == [[6, 2, 4, 4]]
    assert s["imbalance_experts_max"] == 6 / 4               # max 6 over mean 16 / 4
    assert s["imbalance_ep_ranks_max"] == 8 / 8              # ranks hold [6+2, 4+4]
    assert s["aux_loss_mean"] == 2.0 and s["dropped_tokens"] == 0
    # tensor-parallel ranks route the same tokens: divided by their number
    assert load_summary(ranks, ep=1, replicas=2)["tokens_per_expert"] == [[3, 1, 2, 2]]


def test_all_to_all_priced_by_hand():
    """8 ranks, 2 nodes of 4 (100 GB/s, 1 us inside; 10 GB/s, 10 us across), 64 MB per rank:
    7 exchanges at the larger latency; 4/8 of the bytes leave the node (10 GB/s), 7/8 leave the
    rank (100 GB/s): the node link bounds, 32 MB / 10 GB/s."""
    from ddlbench.network.model import Dimension, collective_time
    inner = Dimension(name="node", size=4, bandwidth=100e9, latency=1e-6)
    outer = Dimension(name="cluster", size=2, bandwidth=10e9, latency=10e-6)
    t, alg = collective_time("all_to_all", 64e6, [(4, inner), (2, outer)])
    assert alg == "pairwise" and t == pytest.approx(7 * 10e-6 + 32e6 / 10e9)
    assert collective_time("all_to_all", 64e6, [(1, inner)])[0] == 0.0


def test_all_to_all_payload_and_cost_model_by_hand():
    """moe_tiny at 2 ranks, ep=2, one micro-batch of 4 samples: each MoE layer hands 512 tokens x 2
    copies x 128 x 4 bytes = 524,288 B to all-to-all 4 times (dispatch, combine, their gradients)."""
    from ddlbench.adapters.cost import ModelProfile
    from ddlbench.models.moe import all_to_all_payload
    assert all_to_all_payload(2, 512, 2, 128, 4) == 2 * 4 * 524_288
    plan = plan_from_overrides(["framework=expert_parallel", "model=moe_tiny", "launcher.nproc=2",
                                "run.global_batch=8"])
    prof = ModelProfile(params=1000, largest_block_params=400, blocks=2, activation_bytes_per_sample=0,
                        checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0, experts_params=600,
                        moe_layers=2, routed_bytes_per_sample=128 * 2 * 128 * 4)
    cost = plan.variant.cost_model(plan.dims, prof, "fp32")
    a2a = [t for t in cost.traffic if t.kind == "all_to_all"]
    assert [(t.bytes, t.count, t.ranks, t.data_parallel) for t in a2a] == [(4 * 131_072, 8, 2, False)]
    # experts over ep=2 and FSDP2 over dp_shard / ep = 1: their parameters are never all-gathered
    assert not [t for t in cost.traffic if "experts" in t.what]
    assert cost.piece == 1000 and cost.shard_ranks == 2


@pytest.mark.parametrize("overrides,message", [
    (["framework=expert_parallel", "model=gpt2_tiny"], "needs a Mixture-of-Experts model"),
    (["framework=expert_parallel", "model=moe_tiny", "framework.options.ep=3", "launcher.nproc=3",
      "run.global_batch=9"],
     "does not divide model.moe.num_experts 8"),
    (["framework=expert_parallel", "model=moe_tiny", "framework.options.ep=4", "launcher.nproc=2"],
     "does not divide the data-parallel ranks"),
    (["model=moe_tiny", "model.moe.top_k=9"], "moe.top_k 9 is larger than moe.num_experts 8"),
    (["model=llama_tiny", "+model.moe={num_experts: 4, top_k: 1, intermediate_size: 8}"],
     "moe: not a key of family llama"),
    (["model=moe_tiny", "model.family=qwen4"], "not a model family"),
    (["framework=pipeline_1f1b", "model=moe_tiny"], "load-balancing loss"),
    (["model=mixtral_8x7b", "model.moe.norm_topk_prob=false"], "Mixtral always renormalises"),
    (["framework=ddp", "model=moe_tiny", "+framework.options.ep=2"], "this framework has no expert parallelism"),
])
def test_bad_moe_input_is_refused_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_from_overrides(["launcher.nproc=2", *overrides])


def test_dry_run_answers_the_memory_question_at_64_ranks():
    proc = bench("run", "framework=expert_parallel", "model=qwen3_moe_30b_a3b", "launcher.nproc=64",
                 "framework.options.ep=8", "run.global_batch=64", "run.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    import json
    info = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])["expert_parallel"]
    assert info["experts_per_rank"] == 16 and info["moe_layers"] == 48
    # everything FSDP2-sharded over 64 ranks: the experts 1/8 by ep and 1/8 by dp_shard / ep
    assert info["params_per_rank"] == pytest.approx(info["params_total"] / 64, rel=1e-6)
    assert info["model_state_bytes_per_rank"] == pytest.approx(16 * info["params_total"] / 64, rel=1e-6)
    # one micro-batch of one 4096-token sample: 8 copies of each token, 7/8 of them leave the rank,
    # there and back, forward and backward, 2048-wide bf16
    assert info["all_to_all_bytes_per_layer_per_microbatch_bf16"] == 4 * 4096 * 8 * 2048 * 2 * 7 // 8


def ep_matches_one_rank(root, *common: str) -> tuple[dict, dict]:
    """One rank (DDP) and ep=2 over 2 ranks of the same run: the same losses (1e-6 relative) and
    parameters; both records, for what a caller checks further."""
    from test_equivalence import assert_same_params
    _, one = run_record(root / "one", "framework=ddp", "launcher.nproc=1", *common, "run.param_fingerprint=true")
    _, ep = run_record(root / "ep", "framework=expert_parallel", "launcher.nproc=2", *common, "run.param_fingerprint=true")
    assert one["status"] == "ok" and ep["status"] == "ok", (one.get("error"), ep.get("error"))
    a = [l for _, l in one["convergence"]["train_loss"]]
    assert [l for _, l in ep["convergence"]["train_loss"]] == pytest.approx(a, rel=1e-6)
    assert_same_params(ep["final_params"]["fingerprint"], one["final_params"]["fingerprint"], 1e-6)
    return one, ep


@pytest.fixture(scope="module")
def ep_runs(tmp_path_factory):
    """moe_tiny without the load-balancing loss (it is a per-rank mean: not the one-rank loss):
    one rank (DDP), and expert parallelism ep=2 over 2 ranks."""
    root = tmp_path_factory.mktemp("moe")
    common = ("model=moe_tiny", "model.moe.aux_loss_coef=0", "run.global_batch=8", "run.warmup_steps=2",
              "run.measure_steps=4", "run.param_fingerprint=true", "run.comm_profile=false")
    _, one = run_record(root / "runs" / "one", "framework=ddp", "launcher.nproc=1", *common)
    _, ep = run_record(root / "runs" / "ep", "framework=expert_parallel", "launcher.nproc=2", *common)
    return one, ep, root


@pytest.mark.slow
def test_expert_parallel_matches_one_rank(ep_runs):
    """Dropless routing, the same seed and global batch: ep=2 gives the one-rank losses within 1e-6
    relative (measured 5e-8: the experts' matmuls run on other row sets) and the same parameters."""
    from test_equivalence import assert_same_params
    one, ep, _ = ep_runs
    assert one["status"] == "ok" and ep["status"] == "ok", (one.get("error"), ep.get("error"))
    a = [l for _, l in one["convergence"]["train_loss"]]
    b = [l for _, l in ep["convergence"]["train_loss"]]
    assert b == pytest.approx(a, rel=1e-6)
    assert ep["final_params"]["after_steps"] == one["final_params"]["after_steps"]
    assert_same_params(ep["final_params"]["fingerprint"], one["final_params"]["fingerprint"], 1e-6)


@pytest.mark.slow
def test_the_record_says_what_an_moe_step_did(ep_runs):
    one, ep, _ = ep_runs
    moe, model = ep["moe"], ep["model"]
    assert model["family"] == "qwen3_moe" and model["total_params"] > model["active_params"]
    assert ep["flops"]["analytic"]["counted_over_analytic"] == 1.0
    assert moe["ep"] == 2 and moe["experts_per_rank"] == 4 and moe["dropped_tokens"] == 0
    assert moe["experts_implementation"] == "eager"
    # every routed (token, expert) pair of every training step, each once: a whole number of
    # global batches x 128 tokens x top-2, at least the 6 steps trained
    routed = [sum(layer) for layer in moe["tokens_per_expert"]]
    per_step = 8 * 128 * 2
    assert len(routed) == 2 and routed[0] == routed[1] and routed[0] % per_step == 0 and routed[0] >= 6 * per_step
    assert moe["imbalance_experts_max"] >= moe["imbalance_experts_mean"] >= 1.0
    assert moe["imbalance_ep_ranks_max"] >= 1.0
    assert moe["aux_loss_mean"] is None        # coefficient 0: not computed
    # the all-to-all: measured on the busiest rank, analytic with uniform routing. A rank hands
    # over its own 2 x N x k rows (dispatch, the combine's gradient) and what it received (the
    # combine, the dispatch's gradient): between the mean N x k and all 2 x N x k at ep=2, so
    # 1 to 1.5 x the analytic volume. The wire bytes counted from the splits match what gloo wrote.
    assert moe["all_to_all_payload_bytes_per_step_analytic"] == 2 * 4 * 512 * 2 * 128 * 4
    assert 1.0 <= moe["all_to_all_payload_bytes_per_step"] / moe["all_to_all_payload_bytes_per_step_analytic"] <= 1.5
    c = ep["comm"]
    assert c["written_bytes_mean"] == pytest.approx(c["wire_bytes_mean"], rel=0.01)
    assert "moe" in one and one["moe"]["ep"] == 1


@pytest.mark.slow
def test_the_report_shows_load_imbalance_and_all_to_all_per_framework(ep_runs):
    one, ep, root = ep_runs
    proc = bench("report", str(root / "runs"), "--out", str(root / "report"))
    assert proc.returncode == 0, proc.stderr
    md = (root / "report" / "report.md").read_text()
    section = md.split("## Mixture of Experts: load balance and all-to-all", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| run ")}
    assert set(rows) == {"one", "ep"}
    assert rows["ep"][4] == "2" and rows["one"][4] == "1"                     # ep
    assert rows["ep"][7] == f"{ep['moe']['imbalance_experts_max']:.2f}, {ep['moe']['imbalance_experts_mean']:.2f}"
    assert "MiB" in rows["ep"][10] and rows["one"][10] == "-"                 # all-to-all per step
    import csv
    summary = list(csv.DictReader((root / "report" / "summary.csv").open()))
    assert {r["run_id"]: r["moe_ep"] for r in summary} == {"one": "1", "ep": "2"}


@pytest.mark.slow
def test_advise_enumerates_prices_and_measures_expert_parallel_layouts(tmp_path):
    """`bench advise model=moe_tiny devices=4`: every ep that divides the data-parallel ranks and the
    8 experts (1, 2, 4) with tp 1 and 2, priced with the all-to-all in the network model, the best
    ones measured; the default candidates of an MoE model include expert parallelism."""
    import json

    from ddlbench.advise.options import default_frameworks
    assert "expert_parallel" in default_frameworks("moe_tiny") and "expert_parallel" not in default_frameworks("gpt2_tiny")
    out = tmp_path / "adv"
    proc = bench("advise", "model=moe_tiny", "devices=4", "frameworks=expert_parallel", "budget_runs=2", "repeats=1",
                 "device_memory_gib=1000", f"dir={out}", "run.warmup_steps=1", "run.measure_steps=3",
                 "run.progress=false", "logger=none", timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    advice = json.loads((out / "advice.json").read_text())
    valid = [c for c in advice["candidates"] if not c["pruned"]]
    assert {(c["layout"]["ep"], c["layout"]["tp"]) for c in valid} == {(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)}
    for c in valid:
        priced = c["predicted"]["comm_parts_s"]
        assert any(k.startswith("all_to_all") for k in priced) == (c["layout"]["ep"] > 1), (c["label"], priced)
    measured = [c for c in valid if c.get("measure")]
    assert len(measured) == 2
    assert advice["recommendation"]["measured_step_s"] > 0
    assert "ep" in " ".join(c["label"] for c in valid)


@pytest.fixture(scope="module")
def ds_runs(tmp_path_factory):
    """DeepSpeed-MoE on moe_tiny at 2 ranks: ep_size 1 and 2 (DeepSpeed's defaults: tokens over
    capacity dropped), ep_size 2 dropless, ep_size 2 at bf16; expert parallelism at bf16."""
    root = tmp_path_factory.mktemp("dsmoe")
    common = ("model=moe_tiny", "launcher.nproc=2", "run.global_batch=8", "run.warmup_steps=2", "run.measure_steps=4",
              "run.comm_profile=false")
    runs = {"ep1": ("framework=deepspeed_moe", "framework.options.ep_size=1"),
            "ep2": ("framework=deepspeed_moe",),
            "dropless": ("framework=deepspeed_moe", "framework.options.drop_tokens=false"),
            "bf16": ("framework=deepspeed_moe", "run.precision=bf16"),
            "ep_bf16": ("framework=expert_parallel", "run.precision=bf16")}
    return {name: run_record(root / name, *more, *common)[1] for name, more in runs.items()}


@pytest.mark.slow
def test_deepspeed_moe_matches_itself_across_ep_sizes_and_records_its_gate(ds_runs):
    """Same gate, same capacity, same random token selection: ep_size 2 gives ep_size 1's losses
    (measured: identical). The record says what DeepSpeed's gate did: tokens over capacity dropped,
    the capacity-padded all-to-all (8 experts x ceil(512 / 8 x 1.0 x 2) = 128 rows, 128 wide, fp32,
    4 per layer, 2 layers = 4 MiB a step, whatever the routing)."""
    for name, rec in ds_runs.items():
        assert rec["status"] == "ok", (name, rec.get("error"))
    a = [l for _, l in ds_runs["ep1"]["convergence"]["train_loss"]]
    b = [l for _, l in ds_runs["ep2"]["convergence"]["train_loss"]]
    assert b == pytest.approx(a, rel=1e-6)
    moe = ds_runs["ep2"]["moe"]
    assert moe["ep"] == 2 and moe["experts_per_rank"] == 4 and moe["dropped_tokens"] > 0
    assert moe["gate"]["capacity_factor"] == 1.0 and moe["gate"]["drop_tokens"] is True
    assert moe["all_to_all_payload_bytes_per_step"] == moe["all_to_all_payload_bytes_per_step_analytic"] == 4 * 2**20
    assert moe["aux_loss_mean"] > 0 and "DeepSpeed TopKGate" in moe["routing"]
    assert ds_runs["ep2"]["framework"]["native_config"]["moe"]["layers"] == 2
    c = ds_runs["ep2"]["comm"]
    assert c["written_bytes_mean"] == pytest.approx(c["wire_bytes_mean"], rel=0.01)
    # dropless at ep_size 2 on gloo: the engine's expert-parallel group syncs the capacity
    assert ds_runs["dropless"]["moe"]["dropped_tokens"] == 0


@pytest.mark.slow
def test_both_expert_parallel_frameworks_train_at_bf16_and_refuse_fp16_with_the_reason(ds_runs):
    for name in ("bf16", "ep_bf16"):
        rec = ds_runs[name]
        how = rec["framework"]["native_config"]["mixed_precision"]
        assert rec["precision"] == "bf16" and ("bf16" in how or "bfloat16" in how), (name, how)
    fp32 = [l for _, l in ds_runs["ep2"]["convergence"]["train_loss"]]
    bf16 = [l for _, l in ds_runs["bf16"]["convergence"]["train_loss"]]
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, rel=0.02)
    from ddlbench.adapters.deepspeed import _cpu_fp16_ok
    plan = plan_from_overrides(["framework=expert_parallel", "model=moe_tiny", "launcher.nproc=2", "run.precision=fp16"])
    assert "fp32 and bf16" in plan.variant.unsupported_reason(plan.cfg, "cpu")
    plan = plan_from_overrides(["framework=deepspeed_moe", "model=moe_tiny", "launcher.nproc=2", "run.precision=fp16"])
    assert (plan.variant.unsupported_reason(plan.cfg, "cpu") is None) == _cpu_fp16_ok()
