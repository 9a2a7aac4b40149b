"""run.step_split: forward / backward / optimizer per measured step, by hooks and device-clock
stamps (ddlbench/metrics/step_split.py). The arithmetic by hand; the hooks on a module; real runs
where the framework wraps the model (DDP with gradient accumulation; DeepSpeed's engine in
test_convex.py, sharing its run), and a pipeline, whose schedule never calls the model and says so."""
from __future__ import annotations

import pytest
import torch
from conftest import run_record

from ddlbench.metrics.step_split import PHASES, StepSplit, split_step

TWO_RANKS = ("launcher.nproc=2", "model=gpt2_tiny", "run.global_batch=8", "run.warmup_steps=1",
             "run.measure_steps=3", "run.comm_profile=false", "run.step_split=true")


def test_split_step_by_hand():
    # two micro-batches, then an optimizer whose wrapper's step fires the hook twice (the last counts)
    marks = [("start", 0.0), ("fwd_start", 0.1), ("fwd_end", 0.4), ("fwd_start", 0.9), ("fwd_end", 1.2),
             ("opt_start", 1.5), ("opt_start", 1.6), ("end", 2.0)]
    got = split_step(marks)
    assert got == pytest.approx({"other": 0.1, "forward": 0.6, "backward": 0.5 + 0.4, "optimizer": 0.4})
    assert sum(got.values()) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="from start to end"):
        split_step([("fwd_start", 0.0), ("end", 1.0)])


def test_hooks_stamp_a_step_in_order_and_leave_other_calls_alone():
    model, seen = torch.nn.Linear(4, 4), []
    opt = torch.optim.AdamW(model.parameters())
    split = StepSplit(model, torch.device("cpu"))
    model(torch.randn(2, 4))                    # outside a step: not stamped
    for _ in range(2):
        split.begin()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        split.end()
        seen.append([k for k, _ in split.steps[-1]])
    out = split.result()
    assert seen == [["start", "fwd_start", "fwd_end", "opt_start", "end"]] * 2
    assert out["available"] and out["steps"] == 2 and out["forward_calls"] == 1
    assert set(out["median_s"]) == set(PHASES) and all(v >= 0 for v in out["median_s"].values())
    assert sum(out["share"].values()) == pytest.approx(1.0)
    n = len(split.steps)
    model(torch.randn(2, 4)).sum().backward()   # result() removed the hooks
    opt.step()
    assert len(split.steps) == n


def test_a_step_without_the_models_forward_is_not_split():
    model = torch.nn.Linear(2, 2)
    split = StepSplit(model, torch.device("cpu"))
    split.begin()
    split.end()
    out = split.result()
    assert out["available"] is False and "pipeline" in out["reason"]


def test_a_run_with_accumulation_records_its_split(tmp_path):
    """DDP over two micro-batches a step; DeepSpeed's engine is split in tests/test_convex.py (its run shared)."""
    _, rec = run_record(tmp_path / "r", "framework=ddp", *TWO_RANKS, "run.micro_batch=2")
    assert rec["status"] == "ok", rec["error"]
    split = rec["timing"]["step_split"]
    assert split["available"], split
    assert rec["parallel"]["grad_accum"] == 2
    assert split["steps"] == 3 and split["forward_calls"] == 2
    assert len(split["per_rank_median_s"]) == 2
    for phase in ("forward", "backward", "optimizer"):   # each phase ran and was stamped on both ranks
        assert all(r[phase] > 0 for r in split["per_rank_median_s"]), phase


def test_a_pipeline_says_it_cannot_be_split(tmp_path):
    _, rec = run_record(tmp_path / "r", "framework=pipeline_gpipe", *TWO_RANKS)
    assert rec["status"] == "ok", rec["error"]
    assert rec["timing"]["step_split"]["available"] is False
    assert "pipeline" in rec["timing"]["step_split"]["reason"]
