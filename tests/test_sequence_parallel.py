"""Megatron-style sequence parallelism under tensor parallelism (conf/framework/tensor_parallel_sp.yaml,
`framework.options.sequence_parallel`): the 2-rank equivalence with DDP is in the gate
(tests/test_equivalence.py); here 4 ranks of TP 2 + SP x FSDP2 2 against one process, what it
sends (all-gathers and reduce-scatters in place of all-reduces, as its cost model says), the
record, and the errors before any process starts."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides

STEPS = ["model=llama_tiny", "run.global_batch=8", "run.warmup_steps=1", "run.measure_steps=3"]


def test_tp_with_sequence_parallel_times_fsdp2_at_four_ranks_trains_like_one_process(tmp_path):
    _, one = run_record(tmp_path / "one", "framework=ddp", "launcher.nproc=1", *STEPS, timeout=240)
    _, rec = run_record(tmp_path / "sp", "framework=tensor_parallel_fsdp", "framework.options.tp=2",
                        "framework.options.dp_shard=2", "framework.options.sequence_parallel=true",
                        "launcher.nproc=4", *STEPS, timeout=270)
    assert one["status"] == "ok" and rec["status"] == "ok", rec.get("error")
    assert [x for _, x in rec["convergence"]["train_loss"]] == pytest.approx(
        [x for _, x in one["convergence"]["train_loss"]], rel=1e-5)
    assert (rec["parallel"]["tp"], rec["parallel"]["dp_shard"]) == (2, 2)
    native = rec["framework"]["native_config"]
    assert native["sequence_parallel"]["input_layernorm/post_attention_layernorm"].startswith("SequenceParallel")
    # no all-reduce of block outputs: the only all-reduces sum the norms' weight gradients (two a
    # block and the final norm's: they saw parts of the sequence), a hidden-size vector each
    calls, sent = rec["comm"]["per_step_calls"], rec["comm"]["per_step_bytes"]
    blocks, hidden = 2, 128
    assert calls["all_reduce"] == 2 * blocks + 1 and sent["all_reduce"] == (2 * blocks + 1) * 4 * hidden


def test_its_cost_model_counts_what_a_run_sends(tmp_path):
    """2 ranks, TP + SP only (dp 1): the cost model's messages are the run's, kind by kind."""
    from costs import variant

    from ddlbench.estimate.profile import profile
    _, rec = run_record(tmp_path / "r", "framework=tensor_parallel_sp", "launcher.nproc=2", *STEPS, timeout=240)
    assert rec["status"] == "ok", rec.get("error")
    plan = plan_from_overrides(["framework=tensor_parallel_sp", "launcher.nproc=2", *STEPS])
    cls, options = variant("tensor_parallel_sp")
    cost = cls(cls.Options(**options)).cost_model(plan.dims, profile(plan.cfg.model), "fp32")
    counted = {t.kind: t.count for t in cost.traffic if t.ranks > 1}
    sent = {k: sum(v.values()) for k, v in rec["comm"]["per_step_calls_by_group"].items()}
    assert counted == sent
    per_call = {k: rec["comm"]["per_step_bytes"][k] / sent[k] for k in sent}
    assert all(t.bytes == pytest.approx(per_call[t.kind]) for t in cost.traffic if t.ranks > 1)


@pytest.mark.parametrize("overrides,message", [
    (["framework=tensor_parallel_sp", "framework.options.tp=1", "framework.options.dp_shard=2"],
     "needs tensor parallelism (tp > 1)"),
    (["framework=tensor_parallel_sp", "model.seq_len=127"], "is not divisible by tp = 2"),
    (["framework=tensor_parallel_sp", "model=gpt2_tiny"], "sequence parallelism has no plan for model family 'gpt2'"),
])
def test_what_cannot_run_is_refused_before_any_process_starts(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_from_overrides(["model=llama_tiny", "launcher.nproc=2", "run.global_batch=4", *overrides])
