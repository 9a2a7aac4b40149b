"""The adapters' cost models (ddlbench.adapters.cost): every framework variant in conf/framework has
one (bench advise prices a new yaml variant without code), the rules by hand, and what real runs
send: 2 ranks, gpt2_tiny, 2 micro-batches per step, the record's per-step payload per collective
kind against the cost model's (FSDP gathers on every micro-batch, ZeRO-2/3 reduce on every
micro-step, ZeRO-3 gathers once per step - advise priced all of them once per step before)."""
from __future__ import annotations

import costs
import pytest
from conftest import run_record
from costs import PROF, cost_of

from ddlbench.planning.config import group_options

NO_COST_MODEL = {"ddp_powersgd": "PowerSGD's payload depends on every matrix's shape",
                 "deepspeed_moe": "not written yet: DeepSpeed's capacity-padded all-to-all and expert-data-parallel "
                                  "reductions"}


def first_layout(framework: str, devices: int = 4) -> dict:
    from costs import variant
    cls, options = variant(framework)
    return cls(cls.Options(**options)).advise_options(devices)[0]


@pytest.mark.parametrize("framework", group_options("framework"))
def test_every_variant_has_a_cost_model(framework):
    """The variant's own options decide its cost model: no table keyed by file name anywhere."""
    edits = first_layout(framework)
    sizes = {"tp": edits.get("tp", 1), "pp": edits.get("pp", 1)}
    cost = cost_of(framework, dp=4 // (sizes["tp"] * sizes["pp"]), **sizes,
                   **{k: v for k, v in edits.items() if k not in ("tp", "pp", "dp", "dp_shard")})
    if framework in NO_COST_MODEL:
        assert cost is None
        return
    assert cost is not None and cost.source and cost.piece > 0
    assert cost.traffic, f"{framework} sends nothing at 4 ranks"
    for t in cost.traffic:
        assert t.bytes > 0 and t.count > 0 and t.ranks > 1, t


def test_variants_that_only_change_options_change_the_price():
    half = {("deepspeed_zero2_fp16_comm", "deepspeed_zero2"): "all_reduce", ("horovod_fp16", "horovod"): "all_reduce",
            ("ddp_bf16_hook", "ddp"): "all_reduce", ("ddp_fp16_hook", "ddp"): "all_reduce"}
    for (variant, base), kind in half.items():
        assert cost_of(variant, dp=4).payload_psi()[kind] == cost_of(base, dp=4).payload_psi()[kind] / 2, variant
    # local SGD: one parameter average per period of 4 steps, no gradient all-reduce (groups of 1)
    assert cost_of("ddp_local_sgd", dp=4).payload_psi() == {"all_reduce": 0.25}
    # DASO, 2 nodes x 2 ranks: gradients in the node every step; bf16 parameters across every 4 steps
    daso = cost_of("daso", dp=4, per_node=2)
    assert [(t.kind, t.ranks, t.stride, t.count) for t in daso.traffic] == [
        ("all_reduce", 2, 1, 1), ("all_reduce", 2, 2, 0.25), ("broadcast", 2, 1, 5 * 0.25)]
    # offload moves state to the host, not the traffic
    assert cost_of("deepspeed_zero3_offload", dp=4).traffic == cost_of("deepspeed_zero3", dp=4).traffic
    assert cost_of("fsdp_offload", dp=4).offload_params and not cost_of("fsdp_full", dp=4).offload_params


@pytest.mark.parametrize("framework,expected", [
    # Psi units per step at 2 micro-batches of one step
    ("ddp", {"all_reduce": 1.0}),
    ("horovod", {"all_reduce": 1.0}),
    ("fairscale_oss", {"reduce": 1.0, "broadcast": 1.0}),
    ("fsdp_full", {"all_gather": 4.0, "reduce_scatter": 1.0}),       # gathered in forward and backward, per micro-batch
    ("fsdp_grad_op", {"all_gather": 2.0, "reduce_scatter": 1.0}),
    ("deepspeed_zero1", {"all_reduce": 1.0, "all_gather": 1.0}),      # reduced at the boundary
    ("deepspeed_zero2", {"all_reduce": 2.0, "all_gather": 1.0}),      # reduced on every micro-step
    ("deepspeed_zero3", {"all_gather": 1.0, "reduce_scatter": 2.0}),  # gathered once while the model fits max_live
])
def test_payload_per_step_at_two_micro_batches_by_hand(framework, expected):
    assert cost_of(framework, dp=2, ga=2).payload_psi() == expected


def test_zero3_past_max_live_parameters_gathers_per_micro_batch():
    cost = cost_of("deepspeed_zero3", dp=2, ga=2, stage3_max_live_parameters=500)   # PROF has 1000
    assert cost.payload_psi()["all_gather"] == 4.0
    assert cost.buffers["gathered parameters (kept from forward to backward)"] == 4 * 500


def test_zero3_keeps_parameters_under_its_persistence_threshold_whole_on_every_rank():
    """1,000 parameters in tensors of 600, 300 and 100 elements, threshold 300: the 400 in the two
    small tensors stay whole on each of 4 ranks beside their partition (fp32: 4 x (1000 / 4 + 400) =
    2,600 bytes); the gathered parameters are the other 600. Sizes unknown: nothing persists."""
    import dataclasses
    prof = dataclasses.replace(PROF, param_numels=(100, 300, 600))
    assert prof.params_at_most(300) == 400 and PROF.params_at_most(300) == 0
    cost = cost_of("deepspeed_zero3", dp=4, model=prof, stage3_param_persistence_threshold=300)
    assert cost.state_bytes("adamw")["params"] == 4 * (1000 / 4 + 400)
    assert cost.buffers["gathered parameters (kept from forward to backward)"] == 4 * 600
    assert cost_of("deepspeed_zero3", dp=4, stage3_param_persistence_threshold=300).state_bytes("adamw")["params"] == 1000


def test_buckets_by_hand():
    from ddlbench.adapters.cost import MiB, buckets
    assert buckets(0.5 * MiB, 25 * MiB) == 1 and buckets(61 * MiB, 25 * MiB) == 3 and buckets(61 * MiB, None) == 1
    big = cost_of("ddp", dp=2, model=PROF.__class__(**{**PROF.__dict__, "params": 16 * MiB}))   # 64 MiB of gradients
    assert [(t.bytes, t.count) for t in big.traffic] == [(64 * MiB / 3, 3)]


MEASURED = ("ddp", "fsdp_full", "fsdp_grad_op", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "fairscale_oss")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One 2-rank gpt2_tiny run per framework at 2 micro-batches per step."""
    root = tmp_path_factory.mktemp("cost")
    out = {}
    for fw in MEASURED:
        _, rec = run_record(root / fw, f"framework={fw}", "model=gpt2_tiny", "launcher.nproc=2", "run.global_batch=8",
                            "run.micro_batch=2", "run.warmup_steps=1", "run.measure_steps=2", "logger=none",
                            "run.progress=false")
        out[fw] = rec
    return out


@pytest.mark.slow
@pytest.mark.parametrize("framework", MEASURED)
def test_cost_model_matches_what_a_run_sends(measured, framework):
    from ddlbench.adapters.cost import ModelProfile
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import plan_from_overrides
    rec = measured[framework]
    assert rec["status"] == "ok", rec["error"]
    assert rec["parallel"]["grad_accum"] == 2
    plan = plan_from_overrides([f"framework={framework}", "model=gpt2_tiny", "launcher.nproc=2", "run.global_batch=8",
                                "run.micro_batch=2"])
    prof: ModelProfile = profile(plan.cfg.model)
    assert prof.params == rec["model"]["params"]
    cost = plan.variant.cost_model(plan.dims, prof, "fp32")
    psi = 4 * prof.params
    predicted = {k: v * psi for k, v in cost.payload_psi().items()}
    got = rec["comm"]["per_step_bytes"]
    # every kind the model names is sent in that volume; what it leaves out is tiny (ZeRO's 4-byte overflow check)
    for kind, nbytes in predicted.items():
        assert got.get(kind, 0) == pytest.approx(nbytes, rel=1e-3), (kind, got, predicted)
    assert sum(v for k, v in got.items() if k not in predicted) < 1e-3 * psi, got
    # the record's analytic volume is the cost model's
    assert rec["comm"]["analytic_payload_bytes"] == pytest.approx(predicted, rel=1e-9)
    # messages where the framework issues one collective per bucket or unit
    if framework in ("ddp", "fsdp_full", "fsdp_grad_op"):
        calls = {}
        for t in cost.traffic:
            calls[t.kind] = calls.get(t.kind, 0) + t.count
        assert rec["comm"]["per_step_calls"] == pytest.approx(calls), (rec["comm"]["per_step_calls"], calls)


def test_a_new_yaml_variant_is_advised_without_code(tmp_path):
    """A user's own variant (DeepSpeed ZeRO-2 with 1 MB buckets) dropped into conf/framework is
    enumerated, priced and memory-estimated by advise with no code change: its buckets are read
    from its options by the adapter's cost model (advise has no table keyed by file name)."""
    from ddlbench.adapters.cost import ModelProfile
    from ddlbench.advise.grid import enumerate_grid
    from ddlbench.estimate.memcheck import predicted
    from ddlbench.planning.config import CONF_DIR

    base = (CONF_DIR / "framework" / "deepspeed_zero2.yaml").read_text()
    name = "zz_test_zero2_1mb_buckets"
    path = CONF_DIR / "framework" / f"{name}.yaml"
    path.write_text(base.replace("variant: zero2", "variant: zero2_1mb")
                    .replace("reduce_bucket_size: 500000000", "reduce_bucket_size: 250000")
                    .replace("allgather_bucket_size: 500000000", "allgather_bucket_size: 250000"))
    try:
        costs.variant.cache_clear()
        assert name in group_options("framework")
        big = ModelProfile(params=10_000_000, largest_block_params=2_000_000, blocks=4,
                           activation_bytes_per_sample=1000, checkpointed_bytes_per_sample=100,
                           boundary_bytes_per_sample=50)
        new, old = cost_of(name, dp=4, model=big), cost_of("deepspeed_zero2", dp=4, model=big)
        assert new.payload_psi() == old.payload_psi()              # the same bytes ...
        n_new = sum(t.count for t in new.traffic if t.kind == "all_reduce")
        n_old = sum(t.count for t in old.traffic if t.kind == "all_reduce")
        assert n_new == 40 * n_old                                  # ... in 1 MB messages: 40 MB / 1 MB
        grid = [c for c in enumerate_grid("gpt2_tiny", 2, 8, frameworks=[name]) if not c.pruned]
        assert grid and all(c.framework == name for c in grid)
        ref = next(c for c in enumerate_grid("gpt2_tiny", 2, 8, frameworks=["deepspeed_zero2"])
                   if not c.pruned and c.label().split(" ", 1)[1] == grid[0].label().split(" ", 1)[1])
        # two reduce buckets (overlap_comm) of reduce_bucket_size fp32 elements each: 2 x 4 x (5e8 - 2.5e5)
        assert predicted(ref.plan)["buffers"] - predicted(grid[0].plan)["buffers"] == 2 * 4 * (500_000_000 - 250_000)
    finally:
        path.unlink()
        costs.variant.cache_clear()
