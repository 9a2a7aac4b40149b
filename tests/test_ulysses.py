"""DeepSpeed-Ulysses sequence parallelism with ZeRO (conf/framework/deepspeed_ulysses.yaml,
ddlbench/adapters/ulysses.py). The 2-rank run (sp 2) is in the DDP gate (tests/test_equivalence.py);
here sp 2 x 2 ZeRO-2 replicas at 4 ranks against one process, what it sends (four all-to-alls per
layer each way among the sp pair, counted through DeepSpeed's custom op), and the errors."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides

STEPS = ["model=llama_tiny", "model.attention=sdpa", "run.global_batch=8", "run.warmup_steps=1",
         "run.measure_steps=3", "run.micro_batch=2"]


def test_ulysses_times_zero2_at_four_ranks_trains_like_one_process(tmp_path):
    _, one = run_record(tmp_path / "one", "framework=ddp", "launcher.nproc=1", *STEPS, timeout=240)
    _, rec = run_record(tmp_path / "sp", "framework=deepspeed_ulysses", "framework.options.sp=2",
                        "launcher.nproc=4", *STEPS, timeout=270)
    assert one["status"] == "ok" and rec["status"] == "ok", rec.get("error")
    assert [x for _, x in rec["convergence"]["train_loss"]] == pytest.approx(
        [x for _, x in one["convergence"]["train_loss"]], rel=1e-5)
    par = rec["parallel"]
    assert (par["cp"], par["dp"], par["micro_batch"], par["grad_accum"]) == (2, 2, 2, 2)
    assert rec["framework"]["native_config"]["sequence_parallel"]["sp"] == 2
    # per layer and micro-batch: q, k, v and the output, forward and backward, among the sp pair
    calls = rec["comm"]["per_step_calls_by_group"]["all_to_all"]
    layers, micro = 2, 2
    assert calls == {"2@1": 8 * layers * micro}
    assert "sequence (Ulysses)" in rec["framework"]["taxonomy"]["parallelism"]
    # its cost model's all-to-alls are the run's, message for message and byte for byte
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import validate
    plan = validate(rec["config"])
    cost = plan.variant.cost_model(plan.dims, profile(plan.cfg.model), "fp32")
    a2a = [t for t in cost.traffic if t.kind == "all_to_all"]
    assert sum(t.count for t in a2a) == 8 * layers * micro and all(t.ranks == 2 for t in a2a)
    assert sum(t.bytes * t.count for t in a2a) == pytest.approx(rec["comm"]["per_step_bytes"]["all_to_all"])


@pytest.mark.parametrize("overrides,message", [
    (["model=llama_tiny", "model.attention=eager"], "wraps SDPA attention: model.attention=sdpa"),
    (["model=gpt2_tiny", "model.attention=sdpa"], "dense rotary decoders"),
    (["model=llama_tiny", "model.attention=sdpa", "launcher.nproc=3", "run.global_batch=3"],
     "model.n_head = 4 is not divisible by sp = 3"),
    (["model=llama_tiny", "model.attention=sdpa", "model.seq_len=100", "launcher.nproc=8",
      "run.global_batch=8"], "model.seq_len = 100 is not divisible by sp = 8"),
    (["model=llama_tiny", "model.attention=sdpa", "framework.options.sp=1"], "needs 2 or more"),
])
def test_what_cannot_run_is_refused_before_any_process_starts(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_from_overrides(["framework=deepspeed_ulysses", "launcher.nproc=2", "run.global_batch=4", *overrides])
