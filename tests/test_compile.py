"""run.compile: torch.compile as each framework recommends (per block before the wrapper, as
torchtitan does; DeepSpeed's engine.compile()), compiled in warm-up, its time in startup_s, and the
losses those of the eager run. Compiling on CPU is slow: one run per framework, the models
alternating; benchmarks/compile_pairs.py runs all 8 pairs."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides
from ddlbench.rank.runner import compile_time

STEPS = ("launcher.nproc=2", "run.warmup_steps=1", "run.measure_steps=3", "run.global_batch=8", "run.comm_profile=false")
# Compiled kernels reorder float sums (fused elementwise chains, other matmul splits): losses of 4
# steps agree to ~1e-6 relative here; 1e-4 leaves room without hiding a wrong model
LOSS_RTOL = 1e-4
CASES = [("ddp", "gpt2_tiny"), ("fsdp_full", "llama_tiny"), ("deepspeed_zero2", "llama_tiny"), ("horovod", "gpt2_tiny"),
         ("expert_parallel", "moe_tiny")]    # every Variant whose `compiles` says so (test_contract holds the list)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("framework,model", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_compiled_run_matches_eager(tmp_path, framework, model):
    _, eager = run_record(tmp_path / "eager", f"framework={framework}", f"model={model}", *STEPS)
    _, compiled = run_record(tmp_path / "compiled", f"framework={framework}", f"model={model}", *STEPS,
                             "run.compile=true", timeout=540)
    assert eager["status"] == "ok", eager["error"]
    assert compiled["status"] == "ok", compiled["error"]
    a = [loss for _, loss in eager["convergence"]["train_loss"]]
    b = [loss for _, loss in compiled["convergence"]["train_loss"]]
    assert b == pytest.approx(a, rel=LOSS_RTOL)
    assert "compile" in compiled["framework"]["native_config"]["compile"]
    assert eager["framework"]["native_config"]["compile"] is None
    assert compiled["startup_s"]["compile_s"] >= 0 and "compile_s" not in (eager["startup_s"] or {})


def test_compile_time_is_the_first_step_less_a_measured_one():
    gathered = [{"all_step_time_s": [5.0, 0.2, 0.1, 0.1, 0.3], "step_time_s": [0.1, 0.1, 0.3]},
                {"all_step_time_s": [6.0, 0.2, 0.1, 0.2, 0.1], "step_time_s": [0.1, 0.2, 0.1]}]
    # first step: max over ranks 6.0; measured: per step max over ranks [0.1, 0.2, 0.3] -> median 0.2
    assert compile_time(gathered)["compile_s"] == pytest.approx(5.8)


def test_every_variant_that_compiles_is_run_compiled_here():
    from test_contract import variant_classes
    compiled = {plan_from_overrides([f"framework={f}", f"model={m}", "launcher.nproc=2"]).variant.name for f, m in CASES}
    assert {c.name for c in variant_classes() if c(c.Options()).abilities().compiles} == compiled


def test_a_strategy_without_compile_says_so_and_compile_needs_a_warm_up_step():
    plan = plan_from_overrides(["framework=daso", "launcher.nproc=2", "run.compile=true"])
    assert "run.compile" in plan.variant.unsupported_reason(plan.cfg, "cpu")
    plan = plan_from_overrides(["framework=ddp", "launcher.nproc=2", "run.compile=true"])
    assert plan.variant.unsupported_reason(plan.cfg, "cpu") is None
    with pytest.raises(ConfigError, match="warmup_steps >= 1"):
        plan_from_overrides(["framework=ddp", "run.compile=true", "run.warmup_steps=0"])
