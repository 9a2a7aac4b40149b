"""No silent CPU fallback: a run that asked for GPUs, or was given them, fails with the reason
when CUDA is not available (ddlbench/machine/device.py), and says so in result.json."""
from __future__ import annotations

import json

import pytest
from conftest import bench

from ddlbench.errors import ConfigError
from ddlbench.machine.device import gpus_expected, resolve_device


def test_hints_that_gpus_were_given():
    assert gpus_expected({}) is None
    assert gpus_expected({"SLURM_GPUS_ON_NODE": "4"}) == "SLURM_GPUS_ON_NODE=4"
    assert gpus_expected({"SLURM_JOB_GPUS": "0,1"}) == "SLURM_JOB_GPUS=0,1"
    assert gpus_expected({"SLURM_GPUS_ON_NODE": "0"}) is None
    assert gpus_expected({"CUDA_VISIBLE_DEVICES": "0,1"}) == "CUDA_VISIBLE_DEVICES=0,1"
    for none in ("", "-1", "NoDevFiles"):
        assert gpus_expected({"CUDA_VISIBLE_DEVICES": none}) is None
    assert gpus_expected({"DDLBENCH_EXPECT_GPU": "1"}).startswith("DDLBENCH_EXPECT_GPU=1")


def test_resolve_device():
    assert resolve_device("auto", True, {}) == "cuda"
    assert resolve_device("cuda", True, {}) == "cuda"
    assert resolve_device("auto", False, {}) == "cpu"                                # a laptop
    assert resolve_device("cpu", False, {"SLURM_GPUS_ON_NODE": "8"}) == "cpu"        # deliberate
    assert resolve_device("cpu", True, {}) == "cpu"
    with pytest.raises(ConfigError, match="run.device=cuda but CUDA is not available"):
        resolve_device("cuda", False, {}, torch_cuda="13.0")
    with pytest.raises(ConfigError, match=r"GPUs were allocated \(SLURM_GPUS_ON_NODE=8\).*run.device=cpu"):
        resolve_device("auto", False, {"SLURM_GPUS_ON_NODE": "8"}, torch_cuda="13.0")


@pytest.mark.parametrize("overrides,env,words", [
    (("run.device=cuda",), {}, "run.device=cuda but CUDA is not available"),
    ((), {"CUDA_VISIBLE_DEVICES": "0"}, "GPUs were allocated (CUDA_VISIBLE_DEVICES=0)"),
], ids=["device_cuda", "gpus_allocated"])
def test_a_gpu_run_without_cuda_fails_with_the_reason(tmp_path, overrides, env, words):
    proc = bench("run", "logger=none", "run.progress=false", f"run.dir={tmp_path / 'r'}", *overrides, env=env)
    rec = json.loads((tmp_path / "r" / "result.json").read_text())
    assert rec["status"] == "failed" and rec["error"]["type"] == "no_gpu" and words in rec["error"]["message"]
    assert proc.returncode != 0 and not (tmp_path / "r" / "logs").exists()    # no rank started


def test_rank_to_gpu_mapping():
    from ddlbench.machine.device import check_gpu_count, cuda_index
    assert [cuda_index(r, 8) for r in range(8)] == list(range(8))
    assert cuda_index(5, 1) == 0                    # --gpus-per-task=1: each task sees its own GPU
    with pytest.raises(ConfigError, match="local rank 4 but only 4 GPUs"):
        cuda_index(4, 4)
    with pytest.raises(ConfigError, match="no CUDA device"):
        cuda_index(0, 0)
    check_gpu_count(8, 8)
    with pytest.raises(ConfigError, match="launcher.nproc=2 but 1 GPU"):
        check_gpu_count(2, 1)


def test_cuda_peaks_are_reset_after_setup(monkeypatch):
    """The CUDA branch, with torch.cuda's counters stubbed: setup's peak (the whole fp32 model
    before sharding) is kept apart and the counters reset, so the reported peak is the loop's."""
    import torch

    from ddlbench.adapters.common import loop_peaks, setup_peaks
    counters = {"peak": 1000, "resets": 0}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: counters["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: counters["peak"] + 24)

    def reset(d=None):
        counters["resets"] += 1
        counters["peak"] = 0
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    device = torch.device("cuda", 0)
    setup = setup_peaks(device)
    counters["peak"] = 300                       # what the training loop then allocates at most
    m = loop_peaks(device, setup)
    assert counters["resets"] == 1
    assert (m["setup_peak_allocated_bytes"], m["peak_allocated_bytes"], m["peak_reserved_bytes"]) == (1000, 300, 324)


def test_step_boundaries_wait_for_the_compute_stream_only():
    """A device-wide synchronize at each step would serialise communication a framework keeps in
    flight across steps (DASO's global all-reduce); DeepSpeed's timer must not add its own."""
    import torch

    from ddlbench.adapters.base import RankContext
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.rank.runner import step_sync
    assert step_sync("cuda") == "torch.cuda.current_stream().synchronize()" and step_sync("cpu") is None
    plan = plan_from_overrides(["framework=deepspeed_zero2", "launcher.nproc=2"])
    ctx = RankContext(rank=0, local_rank=0, world_size=2, device=torch.device("cuda", 0), backend="nccl",
                      precision="bf16")
    cfg = plan.variant.strategy_class()(plan.variant, ctx, plan.dims).ds_config(plan.cfg.optim)
    assert cfg["timers"] == {"throughput": {"enabled": True, "synchronized": False}}


def test_attention_defaults_to_sdpa_causal_on_cuda_and_is_recorded():
    from ddlbench.models import build
    from ddlbench.models.language import attention_impl
    from ddlbench.planning.config import plan_from_overrides
    assert attention_impl("auto", "cuda") == "sdpa_causal" and attention_impl("auto", "cpu") == "eager"
    assert attention_impl("eager", "cuda") == "eager" and attention_impl("sdpa", "cpu") == "sdpa"
    mc = plan_from_overrides(["model=gpt2_tiny"]).cfg.model
    assert build(mc, "cuda").config["attn_implementation"] == "sdpa_causal"
    assert build(mc, "cpu").config["attn_implementation"] == "eager"


def test_precision_auto_is_bf16_on_a_bf16_gpu_and_fp32_elsewhere(monkeypatch):
    """run.precision=auto (the default): the decision, and validate() applying it while the
    plan's raw config keeps what was asked (the record's config says auto, `precision` what ran)."""
    from ddlbench.machine.device import auto_precision, planned_precision
    from ddlbench.planning.config import plan_from_overrides
    assert auto_precision("cuda", True) == "bf16"
    assert auto_precision("cuda", False) == "fp32"     # V100/T4: fp16 would need loss scaling
    assert auto_precision("cpu", True) == "fp32"
    assert planned_precision({"precision": "fp16", "device": "cuda"}) == "fp16"   # asked: kept
    assert planned_precision({"precision": "auto", "device": "cpu"}) == "fp32"
    assert planned_precision({"precision": "auto", "device": "auto"}) == "fp32"   # no GPU here
    import ddlbench.machine.gpus
    h100 = ddlbench.machine.gpus.GpuInfo((ddlbench.machine.gpus.Gpu("NVIDIA H100 80GB HBM3", (9, 0), 80 << 30),), "test")
    monkeypatch.setattr(ddlbench.machine.gpus, "visible_gpus", lambda: h100)     # NVML's answer on an H100 node
    assert planned_precision({"precision": "auto", "device": "auto"}) == "bf16"
    assert planned_precision({"precision": "auto", "device": "cpu"}) == "fp32"   # deliberate CPU
    plan = plan_from_overrides(["model=gpt2_tiny"])
    assert plan.cfg.run.precision == "bf16" and plan.raw["run"]["precision"] == "auto"
    plan = plan_from_overrides(["model=gpt2_tiny", "run.precision=fp32"])
    assert plan.cfg.run.precision == "fp32" and plan.raw["run"]["precision"] == "fp32"
    monkeypatch.setattr(ddlbench.machine.gpus, "visible_gpus", lambda: ddlbench.machine.gpus.GpuInfo((), "test"))
    assert plan_from_overrides(["model=gpt2_tiny"]).cfg.run.precision == "fp32"


def _one_bf16_step(framework: str, *extra: str) -> dict:
    """tests/rank_batch_norm_dtypes.py on one gloo rank: every batch norm's dtypes as its forward
    saw them, the native config and the step's loss."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ddlbench.launch.agent import reserve_port
    script = Path(__file__).with_name("rank_batch_norm_dtypes.py")
    port, held = reserve_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    with held:
        proc = subprocess.run([sys.executable, str(script), framework, *extra], capture_output=True, text=True,
                              env=env, timeout=240, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework,kept", [("fsdp_full", "torch.float32"), ("deepspeed_zero2", "torch.bfloat16")])
def test_batch_norm_parameters_match_their_running_statistics_at_bf16(framework, kept):
    """On an H100 FSDP2 and DeepSpeed 0.19 at bf16 failed every ResNet run in backward: bf16
    BatchNorm parameters beside fp32 running statistics, which cuDNN refuses. FSDP2 keeps batch
    norm fp32 (FSDP1's default): all of them in one unit (one collective for all), or one unit
    each when asked, the same numbers; DeepSpeed casts the buffers with the parameters
    (data_types.buffer_dtype, what module.bfloat16() did before 0.19); each records it. One real
    step on one gloo rank, every layer's dtypes as its forward saw them."""
    got = _one_bf16_step(framework)
    assert len(got["layers"]) == 20 and all(pair == [kept, kept] for pair in got["layers"]), got["layers"]
    native = got["native_config"]
    if framework == "fsdp_full":
        assert (native["fp32_batch_norm_units"], native["fp32_batch_norm_layers"]) == (1, 20)
        per_layer = _one_bf16_step(framework, "framework.options.batch_norm_units=per_layer")
        assert per_layer["layers"] == got["layers"] and per_layer["loss"] == got["loss"]
        assert per_layer["native_config"]["fp32_batch_norm_units"] == 20
    else:
        assert native["deepspeed_config"]["data_types"] == {"buffer_dtype": "bf16"}


def test_deepspeed_casts_buffers_only_for_batch_norm_at_low_precision():
    import torch

    from ddlbench.adapters.base import RankContext
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["framework=deepspeed_zero2", "launcher.nproc=2"])
    for precision, batch_norm, want in (("bf16", True, {"buffer_dtype": "bf16"}), ("fp16", True, {"buffer_dtype": "fp16"}),
                                        ("bf16", False, None), ("fp32", True, None)):
        ctx = RankContext(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"), backend="gloo",
                          precision=precision)
        cfg = plan.variant.strategy_class()(plan.variant, ctx, plan.dims).ds_config(plan.cfg.optim, batch_norm=batch_norm)
        assert cfg.get("data_types") == want, (precision, batch_norm)


def test_global_batch_auto_by_hand():
    from ddlbench.machine.device import auto_global_batch
    assert auto_global_batch("cpu", 32, 4)[0] == 8
    assert auto_global_batch("cuda", 32, 2) == (64, "run.global_batch=auto on GPUs: the model preset's "
                                                    "gpu_batch_per_device 32 x 2 devices")
    assert auto_global_batch("cuda", None, 2)[0] == 8


def test_global_batch_auto_sizes_a_gpu_run_and_leaves_a_given_batch_alone(monkeypatch):
    """run.global_batch=auto, the default: on CPU 8 (recorded as chosen); on GPUs the preset's batch
    per device x devices with run.micro_batch=auto unless set; a given batch is not touched."""
    import ddlbench.machine.device
    from ddlbench.machine.device import planned_global_batch
    from ddlbench.planning.config import compose_raw, plan_from_overrides
    plan = plan_from_overrides(["model=gpt2_tiny"])
    assert plan.dims.global_batch == 8 and plan.raw["run"]["global_batch"] == "auto"
    assert plan.choices["global_batch_auto"]["chosen"] == 8
    assert "global_batch_auto" not in plan_from_overrides(["model=gpt2_tiny", "run.global_batch=16"]).choices
    monkeypatch.setattr(ddlbench.machine.device, "planned_device", lambda requested: "cuda")
    run, why = planned_global_batch(compose_raw(["model=gpt2_small", "launcher.nproc=2"]))
    assert run["global_batch"] == 64 and run["micro_batch"] == "auto" and why["devices"] == 2
    assert "gpu_batch_per_device 32 x 2 devices" in why["why"] and "micro_batch=auto" in why["why"]
    run, _ = planned_global_batch(compose_raw(["model=gpt2_small", "run.micro_batch=4"]))
    assert run["global_batch"] == 32 and run["micro_batch"] == 4
    run, why = planned_global_batch(compose_raw(["model=llama_1b", "run.global_batch=16"]))
    assert run["global_batch"] == 16 and why is None
    run, why = planned_global_batch(compose_raw(["model=gpt2_tiny"]))   # no GPU batch stated: 8, as on CPU
    assert run["global_batch"] == 8 and run["micro_batch"] is None and "no gpu_batch_per_device" in why["why"]
