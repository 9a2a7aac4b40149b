"""run.micro_batch=auto: the largest micro-batch the memory estimator says fits the device (with
HEADROOM), the global batch kept by accumulation, the choice and its reason in the record."""
from __future__ import annotations

import pytest
from conftest import run_record

from ddlbench.config import plan_from_overrides
from ddlbench.errors import ConfigError
from ddlbench.microbatch import HEADROOM, GiB, memory_fraction, pick


def test_pick_by_hand():
    estimates = [(8, 100), (4, 60), (2, 40), (1, 30)]
    assert pick(estimates, 70)[0] == 4            # budget 0.9 x 70 = 63: 8 needs 100, 4 needs 60
    assert pick(estimates, 200)[0] == 8
    mb, why = pick(estimates, 20)                   # nothing fits: the smallest, saying so
    assert mb == 1 and why.startswith("none fits")
    with pytest.raises(ConfigError):
        pick([], 70)


@pytest.mark.parametrize("framework,model", [("ddp", "gpt2_tiny"), ("fsdp_full", "llama_tiny")])
def test_the_next_size_up_would_not_fit(framework, model):
    plan = plan_from_overrides([f"framework={framework}", f"model={model}", "launcher.nproc=2", "run.global_batch=16",
                                "run.micro_batch=auto", "run.device_memory_gb=0.025"])
    auto = plan.choices["micro_batch_auto"]
    est, budget = auto["estimates_bytes"], (1 - HEADROOM) * 0.025 * GiB
    mb = plan.dims.micro_batch
    assert auto["chosen"] == mb and auto["device_memory_source"] == "run.device_memory_gb"
    assert est[str(mb)] <= budget < est[str(2 * mb)], est     # it fits; twice it does not
    assert plan.dims.micro_batch * plan.dims.grad_accum * plan.dims.dp == 16   # the global batch kept
    assert plan.raw["run"]["micro_batch"] == "auto"                          # what was asked


def test_memory_fraction_caps_a_gpu():
    assert memory_fraction(40 * GiB, 80 * GiB) == 0.5 and memory_fraction(None, 80 * GiB) is None
    with pytest.raises(ConfigError, match="exceeds"):
        memory_fraction(100 * GiB, 80 * GiB)


def test_a_run_records_the_choice(tmp_path):
    _, rec = run_record(tmp_path / "r", "framework=ddp", "model=gpt2_tiny", "launcher.nproc=1", "run.global_batch=8",
                        "run.warmup_steps=1", "run.measure_steps=2", "run.micro_batch=auto", "run.device_memory_gb=0.02",
                        "run.comm_profile=false")
    assert rec["status"] == "ok", rec["error"]
    auto = rec["parallel"]["micro_batch_auto"]
    assert rec["parallel"]["micro_batch"] == auto["chosen"] < 8 and "fits" in auto["why"]
    assert rec["parallel"]["grad_accum"] == 8 // auto["chosen"] and rec["config"]["run"]["micro_batch"] == "auto"
