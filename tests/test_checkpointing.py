"""Activation checkpointing as a choice (ddlbench/models/checkpointing.py): the policies by hand,
the memory estimator's activation bytes per policy by hand, and real 2-rank runs of every policy
on DDP and of one each on FSDP2, DeepSpeed and tensor parallelism: ok, recorded, the losses of
no checkpointing (recomputing changes no arithmetic), and the estimate within 10% of torch's
MemTracker on an activation-heavy shape (4 layers, 512 tokens: eager attention's T x T scores)."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.adapters.cost import CostModel, ModelProfile
from ddlbench.estimate.memory import Layout, activation_bytes
from ddlbench.models import checkpointing


def test_policies_by_name():
    n = checkpointing.normalize
    assert [n(False), n(True), n("none"), n("full"), n("selective_layer:02"), n("selective_op"), n(None)] == [
        "none", "full", "none", "full", "selective_layer:2", "selective_op", "none"]
    for bad in ("selective_layer:0", "selective_layer:x", "some", 3):
        with pytest.raises(ValueError, match="must be one of"):
            n(bad)
    # torchtitan's ac_freq: blocks K, 2K, ... counted from 1
    assert [checkpointing.checkpointed_blocks(p, 6) for p in ("none", "full", "selective_layer:2",
                                                              "selective_layer:4", "selective_op")] == [0, 6, 3, 1, 0]
    assert checkpointing.describe("none") is None and "every 2-th" in checkpointing.describe("selective_layer:2")


def test_the_wrapped_blocks_follow_the_policy():
    from ddlbench.models.registry import build
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["framework=ddp", "model=llama_tiny", "model.n_layer=4", "launcher.nproc=1",
                                "run.global_batch=2"])
    for policy, wrapped in (("none", 0), ("full", 4), ("selective_layer:2", 2), ("selective_op", 4)):
        model = build(plan.cfg.model, "cpu").factory()
        assert checkpointing.apply(model, policy) == wrapped
        kinds = [type(b).__name__ for b in model.blocks()]
        assert kinds.count("CheckpointWrapper") == wrapped, kinds
        if policy == "selective_layer:2":
            assert [k == "CheckpointWrapper" for k in kinds] == [False, True, False, True]


def test_pipeline_stages_checkpoint_the_blocks_the_whole_model_would():
    """A pipeline's stages (the model's pieces: embedding, 4 blocks, head; stages of pieces 0-2 and
    3-5) checkpoint blocks numbered over the whole model: selective_layer:2 takes blocks 2 and 4
    (pieces 2 and 4), one in each stage; the embedding and the head never."""
    from torch import nn
    assert checkpointing.chosen_blocks("selective_layer:2", 4) == [1, 3]
    assert checkpointing.chosen_blocks("full", 3) == checkpointing.chosen_blocks("selective_op", 3) == [0, 1, 2]
    assert checkpointing.chosen_blocks("none", 3) == []
    for policy, want in (("none", []), ("full", [1, 2, 3, 4]), ("selective_layer:2", [2, 4]), ("selective_op", [1, 2, 3, 4])):
        stages = [nn.Sequential(*(nn.Linear(2, 2) for _ in range(3))) for _ in range(2)]
        ranges = [range(0, 3), range(3, 6)]
        n = checkpointing.apply_to_stages(stages, ranges, 6, policy)
        got = [i for s, r in zip(stages, ranges) for j, i in enumerate(r) if type(s[j]).__name__ == "CheckpointWrapper"]
        assert (n, got) == (len(want), want), policy


def test_activation_bytes_per_policy_by_hand():
    """full 1000, every block checkpointed 100 (inputs), selective_op 400, 4 blocks, micro-batch 2:
    none 1000; full 100 + 1000/4; selective_layer:2 1000 - 2 x 900/4 + 1000/4; selective_op
    400 + 600/4."""
    prof = ModelProfile(params=10, largest_block_params=2, blocks=4, activation_bytes_per_sample=1000,
                        checkpointed_bytes_per_sample=100, boundary_bytes_per_sample=10,
                        selective_op_bytes_per_sample=400)
    cost = CostModel("test", 10)
    got = {p: activation_bytes(Layout("ddp", dp=1, micro_batch=2, checkpointing=p), prof, cost)
           for p in ("none", "full", "selective_layer:2", "selective_op", True)}
    assert got == {"none": 2000, "full": 2 * 350, "selective_layer:2": 2 * 800, "selective_op": 2 * 550, True: 700}


LONG = ["model=llama_tiny", "model.n_layer=4", "model.seq_len=512", "launcher.nproc=2", "run.global_batch=4",
        "run.warmup_steps=1", "run.measure_steps=2", "run.memory_tracker=true", "run.comm_profile=false"]
CASES = [("ddp", "full"), ("ddp", "selective_layer:2"), ("ddp", "selective_op"), ("fsdp_full", "selective_op"),
         ("tensor_parallel", "selective_layer:2"), ("deepspeed_zero2", "selective_op")]
# DeepSpeed's 500M-element reduce buckets would hide the activations in the total: small buckets
EXTRA = {"deepspeed_zero2": ("framework.options.reduce_bucket_size=1000000",
                             "framework.options.allgather_bucket_size=1000000")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """DDP without checkpointing on the same shape: the losses every policy must give."""
    _, rec = run_record(tmp_path_factory.mktemp("ac") / "none", "framework=ddp", *LONG, timeout=240)
    assert rec["status"] == "ok", rec.get("error")
    return rec


@pytest.mark.parametrize("framework,policy", CASES)
def test_each_policy_runs_is_recorded_keeps_the_losses_and_is_estimated(framework, policy, reference, tmp_path):
    from ddlbench.estimate.memcheck import compare
    from ddlbench.planning.config import validate
    _, rec = run_record(tmp_path / "run", f"framework={framework}", *LONG, *EXTRA.get(framework, ()),
                        f"framework.options.activation_checkpointing={policy}", timeout=240)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["config"]["framework"]["options"]["activation_checkpointing"] == policy
    assert rec["flops"]["recompute"] == checkpointing.recompute_label(policy)
    assert rec["flops"]["hardware_train_per_sample"] > rec["flops"]["train_per_sample"]
    assert rec["framework"]["native_config"]["activation_checkpointing"] == checkpointing.describe(policy)
    losses = [loss for _, loss in rec["convergence"]["train_loss"]]
    want = [loss for _, loss in reference["convergence"]["train_loss"]]
    assert losses == pytest.approx(want, rel=1e-4)
    got = compare(rec, validate(rec["config"]))
    assert abs(got["error"]) <= 0.10, (got["error"], got["estimate"], got["measured"]["peak_bytes"])


def test_the_policy_is_a_parity_field(tmp_path):
    """Runs alike but for their checkpointing: the report's parity table flags the odd one (a user's
    setting, equalised by an override); a framework without the option (a pipeline) is not compared."""
    from reportdata import make_record, write

    from ddlbench import report
    root = tmp_path / "runs"
    for name, fw, policy in (("a", "ddp", False), ("b", "fsdp2", False), ("c", "ddp", "selective_op")):
        rec = make_record(name, framework=fw, sps=100.0)
        rec["config"]["framework"]["options"] = {"activation_checkpointing": policy}
        write(root, rec)
    pipe = make_record("p", framework="pipeline", variant="1f1b")
    pipe["config"]["framework"]["options"] = {"schedule": "1f1b"}
    write(root, pipe)
    rep = report.build([str(root)], tmp_path / "out", progress=False)
    flagged = {r.run_id: r.differs for r in rep.parity.itertuples() if r.differs}
    assert flagged == {"c": ["activation_checkpointing"]}
    got = {r: (v if isinstance(v, str) else None)       # pandas keeps a missing value as NaN
           for r, v in zip(rep.summary["run_id"], rep.summary["activation_checkpointing"])}
    assert got == {"a": "none", "b": "none", "c": "selective_op", "p": None}
