"""Context parallelism, PyTorch-native (conf/framework/context_parallel.yaml,
ddlbench/adapters/context_parallel.py): ring attention over cp with FSDP2 over dp_shard x cp. The
2-rank run (cp 2) is in the DDP gate (tests/test_equivalence.py); here cp 2 x dp_shard 2 at 4 ranks
against one process, what it sends (the ring's all-gathers and all-to-alls, counted inside torch's
handler) against its cost model, and the errors."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides

STEPS = ["model=llama_tiny", "model.attention=sdpa_causal", "run.global_batch=8", "run.warmup_steps=1",
         "run.measure_steps=3", "run.micro_batch=2"]


def test_ring_attention_times_fsdp2_at_four_ranks_trains_like_one_process(tmp_path):
    _, one = run_record(tmp_path / "one", "framework=ddp", "launcher.nproc=1", *STEPS, timeout=240)
    _, rec = run_record(tmp_path / "cp", "framework=context_parallel", "framework.options.cp=2",
                        "launcher.nproc=4", *STEPS, timeout=270)
    assert one["status"] == "ok" and rec["status"] == "ok", rec.get("error")
    assert [x for _, x in rec["convergence"]["train_loss"]] == pytest.approx(
        [x for _, x in one["convergence"]["train_loss"]], rel=1e-5)
    par = rec["parallel"]
    assert (par["cp"], par["dp"], par["dp_shard"], par["micro_batch"], par["grad_accum"]) == (2, 2, 2, 2, 2)
    native = rec["framework"]["native_config"]
    mesh = dict(zip(native["mesh"]["dim_names"], native["mesh"]["shape"]))
    assert (mesh["dp_shard"], mesh["cp"], native["cp"]) == (2, 2, 2)
    assert "CPU flash kernel" in native["ring_kernel"]
    # per layer and micro-batch: k and v gathered over the cp pair in forward and backward, and their
    # gradients passed on twice (cp) in backward; FSDP2's over all four ranks
    layers, micro = 2, 2
    calls = rec["comm"]["per_step_calls_by_group"]
    assert calls["all_to_all"] == {"2@1": 2 * layers * micro}
    assert calls["all_gather"]["2@1"] == 2 * layers * micro
    # its cost model is the run's, kind by kind, byte for byte
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import validate
    plan = validate(rec["config"])
    cost = plan.variant.cost_model(plan.dims, profile(plan.cfg.model), "fp32")
    for kind in ("all_gather", "all_to_all", "reduce_scatter"):
        priced = sum(t.bytes * t.count for t in cost.traffic if t.kind == kind)
        assert priced == pytest.approx(rec["comm"]["per_step_bytes"][kind]), kind


@pytest.mark.parametrize("overrides,message", [
    (["model=llama_tiny", "model.attention=sdpa"], "model.attention=sdpa_causal"),
    (["model=gpt2_tiny"], "dense rotary decoders"),
    (["model=llama_tiny", "model.attention=sdpa_causal", "model.seq_len=102"],
     "model.seq_len = 102 is not divisible by 2 x cp = 4"),
    (["model=llama_tiny", "model.attention=sdpa_causal", "framework.options.cp=1"], "needs 2 or more"),
])
def test_what_cannot_run_is_refused_before_any_process_starts(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_from_overrides(["framework=context_parallel", "launcher.nproc=2", "run.global_batch=4", *overrides])
