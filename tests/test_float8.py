"""run.float8: torchao's Float8Linear in a Llama model's linear layers, applied alike by DDP, FSDP2,
DeepSpeed and Horovod before their wrappers; refused with the reason where it cannot run. On CPU
torch._scaled_mm runs the float8 matmuls for real (for tests, not speed)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import run_record

from ddlbench.adapters.parallelize import float8_eligible
from ddlbench.adapters.variant import float8_reason

# torch._scaled_mm on a CPU is a plain loop (~370x slower than bf16 here, its time ~ M x K x N): the
# float8 runs use llama_tiny at half its width and a quarter of its sequence (still 2 layers, every
# dimension a multiple of 16, so the same 14 linear layers convert): ~1 s a step for ~18 s
FAST = ("model=llama_tiny", "model.n_embd=64", "model.intermediate_size=128", "model.seq_len=32", "run.global_batch=4",
        "run.precision=bf16", "run.float8=true", "launcher.nproc=2", "run.warmup_steps=1", "run.measure_steps=2")


def test_which_linear_layers_become_float8_by_hand():
    assert float8_eligible("net.model.layers.0.mlp.up_proj", 128, 256)
    assert not float8_eligible("net.lm_head", 128, 256)             # the output projection stays bf16
    assert not float8_eligible("net.model.layers.0.mlp.up_proj", 128, 250)   # float8 matmuls need 16 | dims


def test_float8_is_refused_with_the_reason_where_it_cannot_run():
    def cfg(precision="bf16", family="llama", float8=True):
        return SimpleNamespace(run=SimpleNamespace(float8=float8, precision=precision),
                               model=SimpleNamespace(kind="language", family=family, name=f"a {family} model"))
    ddp = SimpleNamespace(name="ddp", abilities=lambda: SimpleNamespace(float8=True))
    pipe = SimpleNamespace(name="pipeline", abilities=lambda: SimpleNamespace(float8=False))
    assert float8_reason(ddp, cfg(float8=False), "cpu") is None
    assert float8_reason(ddp, cfg(), "cpu") is None
    assert float8_reason(ddp, cfg(), "cuda", (9, 0)) is None
    assert "8.9" in float8_reason(ddp, cfg(), "cuda", (8, 0))          # an A100 has no float8 tensor cores
    assert "pipeline" in float8_reason(pipe, cfg(), "cpu")
    assert "run.precision=bf16" in float8_reason(ddp, cfg(precision="fp32"), "cpu")
    assert "Conv1D" in float8_reason(ddp, cfg(family="gpt2"), "cpu")


@pytest.fixture(scope="module")
def float8_runs(tmp_path_factory):
    """One run per framework, each bounded on its own (conftest: the alarm is re-armed per run)."""
    out = {}
    for fw in ("ddp", "fsdp_full", "deepspeed_zero2", "horovod"):
        d = tmp_path_factory.mktemp(fw)
        out[fw] = run_record(d / "run", f"framework={fw}", *FAST)[1]
    return out


def test_every_framework_that_claims_float8_trains_with_it(float8_runs):
    for fw, rec in float8_runs.items():
        assert rec["status"] == "ok", (fw, rec["error"])
        f8 = rec["framework"]["native_config"]["float8"]
        # llama_tiny, 2 layers: q, k, v, o, gate, up, down per layer; lm_head kept
        assert f8["converted"] == 14 and f8["kept"] == ["net.lm_head"] and f8["scaling"] == "tensorwise dynamic"
        assert "float8" in rec["framework"]["precision_recipe"]["matmuls"]
        assert rec["config"]["run"]["float8"] is True
        # MFU on the bf16 peak, and beside it on a FLOP-weighted fp8/bf16 peak (ddlbench/metrics/mfu.py)
        fl = rec["flops"]
        assert fl["float8_share"] == pytest.approx(6 * f8["converted_params"] * rec["model"]["tokens_per_sample"]
                                                   / fl["train_per_sample"])
        assert fl["mfu_float8_weighted"] == pytest.approx(rec["mfu"] * (1 - fl["float8_share"] / 2))
    losses = {fw: [loss for _, loss in rec["convergence"]["train_loss"]] for fw, rec in float8_runs.items()}
    # the same float8 recipe under every wrapper: the same losses (Horovod's as DDP's, both autocast
    # over fp32 parameters; FSDP2's policy and DeepSpeed's engine hold bf16 ones: close, not equal)
    assert losses["horovod"] == pytest.approx(losses["ddp"], rel=1e-5)
    for fw in ("fsdp_full", "deepspeed_zero2"):
        assert losses[fw] == pytest.approx(losses["ddp"], rel=2e-3), fw


def test_float8_on_a_model_it_cannot_convert_is_an_unsupported_result(tmp_path):
    proc, rec = run_record(tmp_path / "r", "framework=ddp", "model=gpt2_tiny", "run.precision=bf16", "run.float8=true")
    assert proc.returncode == 1 and rec["status"] == "unsupported"
    assert "Conv1D" in rec["error"]["message"] and rec["error"]["type"] == "unsupported"


def test_precision_fp8_means_bf16_with_float8_matmuls():
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["model=llama_tiny", "run.precision=fp8"])
    assert plan.cfg.run.precision == "bf16" and plan.cfg.run.float8 is True
    assert plan.raw["run"]["precision"] == "fp8"          # the record's config says what was asked


def test_mfu_on_a_flop_weighted_float8_peak_by_hand():
    """The H200's llama_1b under FSDP2 with float8 (reports/gpu-h200/2026-11-26/B): 112 converted
    linear layers, lm_head kept: 16 x (2 x 2048^2 + 2 x 2048 x 512 + 3 x 2048 x 8192) weights; 6 x that
    x 2,048 tokens of the step's 1.6834e13 FLOPs per sample run as float8 (71.0%); 58.8% MFU on the bf16
    peak is 37.9% on the FLOP-weighted one."""
    from ddlbench.metrics.mfu import float8_share, float8_weighted_mfu
    weights = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)
    assert weights == 973_078_528
    share = float8_share(weights, 2048, 16834124382208)
    assert share == pytest.approx(0.71029, abs=1e-5)
    assert float8_weighted_mfu(0.5878816061211299, share) == pytest.approx(0.37910, abs=1e-5)
    assert float8_weighted_mfu(0.5, 0.0) == 0.5 and float8_weighted_mfu(0.5, 1.0) == 0.25
