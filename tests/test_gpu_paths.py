"""GPU-path decisions that a CPU test can see (desk-checked against the first H100 run's records):
what a run records about its environment, and which message sizes commbench picks where GPUs are."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddlbench.commbench import command as commbench
from ddlbench.machine.envinfo import env_vars


def test_every_nccl_variable_that_was_set_is_recorded():
    environ = {"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5_0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
               "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "4", "HOME": "/root", "MY_NCCL": "x"}
    assert env_vars(environ) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5_0",
                                 "OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_commbench_in_an_srun_task_picks_gpu_sizes_where_gpus_are(monkeypatch, tmp_path):
    """`bench commbench launcher=slurm` with run.device=auto stopped at 16 MiB (CPU sizes): the
    choice tested for the literal string "cuda"."""
    import ddlbench.launch.slurm
    import ddlbench.machine.gpus
    monkeypatch.setattr(ddlbench.machine.gpus, "visible_gpus", lambda: SimpleNamespace(available=True))
    monkeypatch.setattr(ddlbench.launch.slurm, "rank_env", lambda: {"RANK": "1", "WORLD_SIZE": "2"})
    for key in ("RANK", "WORLD_SIZE"):       # the task writes them into os.environ: put back after
        monkeypatch.setenv(key, "0")
    seen = {}
    monkeypatch.setattr(commbench, "_rank", lambda rank, world, opts, port, results: seen.update(opts))
    opts = commbench.parse_args(["launcher=slurm"])            # run.device=auto, no sizes given
    assert commbench._run_srun_task(opts, tmp_path) == 0      # rank 1: nothing to write
    assert seen["sizes"] == commbench.DEFAULT_SIZES["cuda"] and max(seen["sizes"]) == 1 << 30
    monkeypatch.setattr(ddlbench.machine.gpus, "visible_gpus", lambda: SimpleNamespace(available=False))
    assert commbench.device_kind("auto") == "cpu" and commbench.device_kind("cuda") == "cuda"


def test_benchmarks_find_bench_beside_the_interpreter():
    """benchmarks/model_parallel.py ran .venv/bin/bench, absent where the wheels are installed elsewhere."""
    from pathlib import Path
    found = [p.name for p in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")
             if ".venv/bin/bench" in p.read_text()]
    assert not found, found


def test_fast_paths_on_cuda_and_the_cpu_numbers_kept():
    """What a GPU run gets that a CPU run does not: GPT-2's GELU in one kernel, the vocabulary
    padded to a multiple of 64 (nanoGPT's 50304), NHWC convolutions, cuDNN autotuning; each
    overridable and recorded in model.native_config."""
    from ddlbench import models
    from ddlbench.machine.device import cudnn_benchmark
    from ddlbench.models.families.gpt2 import gpt2_activation
    from ddlbench.models.vision import use_channels_last
    from ddlbench.models.vocab import padded_vocab
    from ddlbench.planning.config import plan_from_overrides
    assert (gpt2_activation("auto", "cuda"), gpt2_activation("auto", "cpu")) == ("gelu_pytorch_tanh", "gelu_new")
    assert gpt2_activation("gelu_new", "cuda") == "gelu_new"
    assert (padded_vocab(50257, "auto", "cuda"), padded_vocab(50257, "auto", "cpu"), padded_vocab(50257, 128, "cpu"),
            padded_vocab(128256, "auto", "cuda")) == (50304, 50257, 50304, 128256)
    assert use_channels_last("auto", "resnet50", "cuda") and not use_channels_last("auto", "resnet50", "cpu")
    assert not use_channels_last("auto", "vit", "cuda") and use_channels_last(True, "vit", "cpu")
    assert cudnn_benchmark("vision", "cuda") and not cudnn_benchmark("language", "cuda")
    assert not cudnn_benchmark("vision", "cpu")
    cfg = plan_from_overrides(["model=gpt2_small"]).cfg.model
    native = models.build(cfg, "cuda").config
    assert (native["vocab_size"], native["activation_function"]) == (50304, "gelu_pytorch_tanh")
    assert models.build(cfg, "cpu").config.get("vocab_size", 50257) == 50257


def test_channels_last_computes_the_same_loss():
    import torch

    from ddlbench import models
    from ddlbench.models.spec import example_batch
    from ddlbench.planning.config import plan_from_overrides
    losses = []
    for layout in ("false", "true"):
        cfg = plan_from_overrides(["model=resnet18_tiny", f"model.channels_last={layout}"]).cfg.model
        spec = models.build(cfg, "cpu")
        torch.manual_seed(0)
        model = spec.build()
        assert spec.config["channels_last"] is (layout == "true")
        losses.append(float(model(**example_batch(spec, 4, "cpu"))))
    assert losses[1] == __import__("pytest").approx(losses[0], rel=1e-5)


def test_causal_mask_speaks_the_gpu_images_transformers(monkeypatch):
    """transformers 5.17 (the GPU image) names create_causal_mask's arguments input_embeds,
    cache_position and past_key_values; 5.2x (CI) inputs_embeds and cache. Found on an H200."""
    import torch
    import transformers.masking_utils as mu

    from ddlbench.models.masks import causal_mask
    seen = {}

    def older(config, input_embeds, attention_mask, cache_position, past_key_values, position_ids=None):
        seen.update(config=config, shape=tuple(input_embeds.shape), cache_position=cache_position.tolist(),
                    past_key_values=past_key_values, attention_mask=attention_mask, position_ids=position_ids)
        return "mask"
    monkeypatch.setattr(mu, "create_causal_mask", older)
    assert causal_mask("cfg", torch.zeros(1, 3, 8)) == "mask"
    assert seen == {"config": "cfg", "shape": (1, 3, 8), "cache_position": [0, 1, 2], "past_key_values": None,
                    "attention_mask": None, "position_ids": None}


def test_mfu_on_the_measured_peak_beside_the_datasheets_by_hand(monkeypatch, tmp_path):
    """Datasheet MFU stays the primary figure (comparable with published ones); the measured peak
    (CUDA events, best of three shapes, cached per host, GPU and dtype) is recorded beside it."""
    import torch

    from ddlbench.machine import hardware
    from ddlbench.rank import sections as collect
    assert hardware.matmul_rate(1000, 5, 10.0) == 2 * 1000**3 * 5 / 0.01
    assert hardware.gpu_probe_args("tf32") == (torch.float32, True)
    assert hardware.gpu_probe_args("bf16") == (torch.bfloat16, False)
    assert collect.rebase_mfu(0.3, 989.4e12, 791.5e12) == 0.3 * 989.4e12 / 791.5e12
    assert collect.rebase_mfu(None, 989.4e12, 791.5e12) is None and collect.rebase_mfu(0.3, 1.0, None) is None
    assert collect.measured_peak(torch.device("cpu"), "fp32", 1e11, "cpu probe") == (1e11, "cpu probe")
    probes = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(hardware, "probe_gpu_matmul", lambda device, dtype, tf32: probes.append((dtype, tf32)) or 7.9e14)
    cache = tmp_path / "gpu_peak.json"
    for _ in range(2):    # the second run reads the cache
        peak, source = hardware.measured_gpu_peak(torch.device("cuda", 0), "bf16", cache)
        assert peak == 7.9e14 and "NVIDIA H200|bf16" in source and "CUDA events" in source
    assert probes == [(torch.bfloat16, False)]


def test_launch_bound_by_hand():
    from ddlbench.rank.sections import launch_bound
    assert launch_bound(0.095, 0.100, "cuda", 40.0)["value"] is True   # the host's pace, the GPU idle
    assert launch_bound(0.095, 0.100, "cuda")["value"] is None         # no NVML: cannot tell
    assert launch_bound(0.020, 0.100, "cuda")["value"] is False
    cpu = launch_bound(0.1, 0.1, "cpu")
    assert cpu["value"] is None and cpu["issue_over_step"] == 1.0


# (issue s, median step s, least busy NVML %, launch-bound?): the H200 records of 2026-11-26
# (reports/gpu-h200/2026-11-26/B and B2, llama_1b): the old rule (issue >= 0.9 x step) flagged
# every DeepSpeed run, whose engine waits for the GPU inside its step while the GPU is 88-91% busy
H200_RECORDS = [
    ("deepspeed zero0", 0.9621553517747606 * 0.34592627000000675, 0.34592627000000675, 90.61176470588235, False),
    ("deepspeed zero1", 0.9599929173683059 * 0.34345143650006094, 0.34345143650006094, 89.77380952380952, False),
    ("deepspeed zero2", 0.9588741432950998 * 0.3439732234999724, 0.3439732234999724, 89.04705882352941, False),
    ("deepspeed zero3", 0.9998599863000196 * 0.343580664000001, 0.343580664000001, 88.20238095238095, False),
    ("ddp", 0.71501899637445 * 0.34226294299998017, 0.34226294299998017, 92.06024096385542, False),
    ("fsdp2 full_shard", 0.6596728378923362 * 0.23134974450002233, 0.23134974450002233, 38.62048192771084, False),
    ("fsdp2 cpu_offload", 0.9998948564621573 * 0.810449235999954, 0.810449235999954, 51.43529411764706, True),
]


@pytest.mark.parametrize("name,issue,step,busy,expected", H200_RECORDS, ids=[r[0] for r in H200_RECORDS])
def test_launch_bound_on_the_h200_records(name, issue, step, busy, expected):
    from ddlbench.rank.sections import launch_bound
    assert launch_bound(issue, step, "cuda", busy)["value"] is expected


def test_the_loss_shifts_labels_not_logits_and_means_the_same_tokens():
    """lm_loss no longer slices the (B, T, vocab) logits (a copy before the fp32 upcast's copy):
    the labels are shifted and the last position ignored; the mean is over the same tokens, equal
    to the sliced form bit for bit here, at fp32 and bf16."""
    import torch
    import torch.nn.functional as F

    from ddlbench.models.language import lm_loss
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(3, 7, 11, generator=gen).to(dtype)
        labels = torch.randint(0, 11, (3, 7), generator=gen)
        sliced = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        assert torch.equal(lm_loss(logits, labels), sliced)


def test_ddp_records_the_buckets_it_rebuilt_by_hand():
    from ddlbench.adapters.ddp import bucket_record
    rebuilt = bucket_record([497_000_000], [26_214_400] * 12 + [21_000_000], True)
    assert len(rebuilt["bucket_sizes_bytes"]) == 13 and rebuilt["bucket_sizes_bytes_at_construction"] == [497_000_000]
    assert bucket_record([1, 2], [], False)["bucket_sizes_bytes"] == [1, 2]


def test_horovods_issue_log_reads_device_stamps_after_the_window():
    """On a GPU the host runs ahead of the kernels: Horovod's issue log stamps CUDA events and
    reads them in take() (after the window; reading waits for them), never inside a step."""
    from ddlbench.metrics.comm import IssueLog, device_clock
    reads = []
    ticks = iter(range(100))
    log = IssueLog(marker=lambda: next(ticks), elapsed=lambda a, b: reads.append((a, b)) or (b - a) * 0.5)
    log.add("all_reduce", 100)          # stamp 0
    log.add("all_reduce", 50)           # stamp 1
    log.compute_end()                   # stamp 2
    log.step_end()
    assert reads == []                  # nothing read during the step
    assert log.take() == {"all_reduce": [[1.0, 100], [0.5, 50]]}
    assert reads == [(0, 2), (1, 2)]
    marker, elapsed = device_clock("cpu")
    assert elapsed(1.0, 3.5) == 2.5


def test_horovod_leaves_nccl_to_horovod():
    """Each Horovod rank held a torch NCCL group beside Horovod's own: its launch_env asks for
    the harness's group over gloo."""
    from ddlbench.adapters.horovod import Horovod
    from ddlbench.machine.device import HARNESS_BACKEND_ENV, harness_backend
    env = Horovod(Horovod.Options()).launch_env()
    assert env[HARNESS_BACKEND_ENV] == "gloo"
    assert harness_backend("cuda", env) == "gloo" and harness_backend("cuda", {}) == "nccl"
    assert harness_backend("cpu", {}) == "gloo"
