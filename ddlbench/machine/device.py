"""Which device a run trains on: never a silent CPU fallback when GPUs were asked for.

`run.device=cuda`, or `auto` in a process its scheduler or image gave GPUs (Slurm's GPU
variables, a non-empty CUDA_VISIBLE_DEVICES, DDLBENCH_EXPECT_GPU=1 set by the GPU image), fails
with the reason when CUDA is not available (a container started without GPUs, a driver too old
for torch's CUDA build) instead of training on CPU/gloo and reporting it as a GPU result.
"""
from __future__ import annotations

import os
from typing import Optional

from ddlbench.errors import ConfigError

GPU_HINTS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE",
             "SLURM_GPUS_PER_TASK", "SLURM_GPUS")
NO_DEVICES = ("", "-1", "none", "NoDevFiles", "void")


def gpus_expected(environ=os.environ) -> Optional[str]:
    """Why this process should see GPUs (the variable that says so), or None."""
    if environ.get("DDLBENCH_EXPECT_GPU") == "1":
        return "DDLBENCH_EXPECT_GPU=1 (the GPU image)"
    for key in GPU_HINTS:
        value = environ.get(key, "")
        if value and value not in ("0", *NO_DEVICES):
            return f"{key}={value}"
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() not in NO_DEVICES:
        return f"CUDA_VISIBLE_DEVICES={cvd}"
    return None


def resolve_device(requested: str, cuda_available: bool, environ=os.environ,
                   torch_cuda: Optional[str] = None, unusable: Optional[str] = None) -> str:
    """'cuda' or 'cpu' for run.device = auto | cpu | cuda; ConfigError where GPUs were asked
    for and CUDA is not available (`unusable`: why, where it is known, e.g. a driver too old)."""
    if requested == "cpu":
        return "cpu"
    if cuda_available:
        return "cuda"
    build = f"torch built for CUDA {torch_cuda}" if torch_cuda else "a CPU-only torch build"
    why = unusable or ("a container started without GPUs (--gpus / --nv / pyxis), a driver older than "
                       f"{build} needs, or CUDA_VISIBLE_DEVICES hiding them")
    if requested == "cuda":
        raise ConfigError(f"run.device=cuda but CUDA is not available in this process: {why}")
    hint = gpus_expected(environ)
    if hint:
        raise ConfigError(f"GPUs were allocated ({hint}) but CUDA is not available: {why}. Set "
                          "run.device=cpu to train on CPU deliberately")
    return "cpu"


def launcher_device(requested: str, environ=os.environ) -> str:
    """resolve_device for a process that forks afterwards (launcher, sweep, advise): the GPUs as
    NVML sees them (ddlbench.machine.gpus), never a CUDA context here."""
    if requested == "cpu":
        return "cpu"
    import torch

    from ddlbench.machine.gpus import visible_gpus
    info = visible_gpus()
    return resolve_device(requested, info.available, environ, torch_cuda=torch.version.cuda, unusable=info.unusable)


def planned_device(requested: str) -> str:
    """The device a run of this config will train on, asked of NVML (no CUDA context here; a
    device that cannot be had is the launcher's `no_gpu` result, not an error here)."""
    if requested == "cpu":
        return "cpu"
    from ddlbench.machine.gpus import visible_gpus
    return "cuda" if visible_gpus().available else "cpu"


HARNESS_BACKEND_ENV = "DDLBENCH_HARNESS_BACKEND"


def harness_backend(device_type: str, environ=os.environ) -> str:
    """torch.distributed's backend for the run's default process group: NCCL on CUDA, gloo on CPU.
    A framework that communicates through a library of its own (Horovod) sets
    $DDLBENCH_HARNESS_BACKEND=gloo in its launch_env: the harness's gathers and barriers then go
    over gloo and each rank holds one NCCL, the framework's, as its users' programs do."""
    if device_type != "cuda":
        return "gloo"
    chosen = environ.get(HARNESS_BACKEND_ENV) or "nccl"
    if chosen not in ("nccl", "gloo"):
        raise ConfigError(f"{HARNESS_BACKEND_ENV}={chosen!r}: nccl or gloo")
    return chosen


def cudnn_benchmark(model_kind: str, device_type: str) -> bool:
    """cuDNN picks the fastest convolution algorithm for each shape (it tries them in the first,
    warm-up steps): on CUDA for vision models, whose shapes are fixed; a language model has no convolution."""
    return device_type == "cuda" and model_kind == "vision"


def auto_precision(device_type: str, bf16_supported: bool) -> str:
    """run.precision=auto: bf16 autocast on a GPU with bf16 in hardware (Ampere and later, not
    emulated: ddlbench.machine.gpus.bf16_native), fp32 elsewhere (CPU, V100, T4: their fp16 needs loss
    scaling that several frameworks here do not have). The record keeps both: `precision` is
    what ran, config.run.precision says auto."""
    return "bf16" if device_type == "cuda" and bf16_supported else "fp32"


def planned_precision(run_cfg: dict) -> str:
    """The precision a run of this config trains in: run.precision, or auto resolved on this
    machine's device (run.device, or auto: CUDA where available). Asked of NVML, not CUDA: the
    process deciding this forks afterwards (ddlbench.machine.gpus). A device that cannot be had (GPUs asked
    for, none usable) is the launcher's `no_gpu` result, not an error here."""
    requested = run_cfg.get("precision", "auto")
    if requested != "auto":
        return requested
    if run_cfg.get("device", "auto") == "cpu":
        return auto_precision("cpu", False)
    from ddlbench.machine.gpus import bf16_native, visible_gpus
    info = visible_gpus()
    if not info.available:
        return auto_precision("cpu", False)
    return auto_precision("cuda", bf16_native([g.capability for g in info.gpus], info.hip))


CPU_GLOBAL_BATCH = 8


def auto_global_batch(device_type: str, gpu_batch_per_device, devices: int) -> tuple[int, str]:
    """run.global_batch=auto (the default): (the global batch, why). On CPU 8, the size the suite and
    the CPU reports use; on GPUs the model preset's gpu_batch_per_device x the devices, the batch at
    which a GPU is kept busy (one H200: gpt2_small 32 x 1024 tokens, llama_1b 8 x 2048, resnet50 128;
    reports/gpu-h200/2026-11-26), with run.micro_batch=auto unless set, so that a smaller device
    accumulates instead of running out of memory. A preset without one: 8, as on CPU."""
    if device_type != "cuda":
        return CPU_GLOBAL_BATCH, f"run.global_batch=auto on {device_type}: {CPU_GLOBAL_BATCH}"
    if not gpu_batch_per_device:
        return CPU_GLOBAL_BATCH, (f"run.global_batch=auto: the model preset states no gpu_batch_per_device: "
                                  f"{CPU_GLOBAL_BATCH}")
    return gpu_batch_per_device * devices, (f"run.global_batch=auto on GPUs: the model preset's "
                                            f"gpu_batch_per_device {gpu_batch_per_device} x {devices} devices")


def planned_global_batch(raw: dict) -> tuple[dict, Optional[dict]]:
    """`raw`'s run section with run.global_batch=auto resolved for this machine's device (and
    run.micro_batch=auto on GPUs where it was not set), and the choice for the record (None when
    the global batch was given)."""
    run = raw.get("run") or {}
    if run.get("global_batch", "auto") != "auto":
        return run, None
    launcher, model = raw.get("launcher") or {}, raw.get("model") or {}
    device = planned_device(run.get("device", "auto"))
    devices = int(launcher.get("nproc", 1)) * int(launcher.get("nodes", 1))
    gb, why = auto_global_batch(device, model.get("gpu_batch_per_device"), devices)
    out = {**run, "global_batch": gb}
    sized = device == "cuda" and run.get("micro_batch") is None and gb != CPU_GLOBAL_BATCH
    if sized:
        out["micro_batch"] = "auto"
        why += "; run.micro_batch=auto (not set)"
    return out, {"chosen": gb, "why": why, "device": device, "devices": devices}


def cuda_index(local_rank: int, visible: int) -> int:
    """The CUDA device of a rank. Each task sees exactly one GPU under Slurm's per-task binding
    (--gpus-per-task=1, or a per-task CUDA_VISIBLE_DEVICES): device 0. Otherwise its local rank,
    which must name a visible GPU."""
    if visible < 1:
        raise ConfigError("no CUDA device is visible to this rank")
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise ConfigError(f"local rank {local_rank} but only {visible} GPUs are visible on this node: "
                          "run at most one rank per GPU (launcher.nproc / --ntasks-per-node)")
    return local_rank


def check_gpu_count(nproc: int, visible: int) -> None:
    """The local launcher starts nproc ranks on this machine, one per GPU: no more than there are."""
    if nproc > visible:
        raise ConfigError(f"launcher.nproc={nproc} but {visible} GPU(s) are visible: one rank per GPU "
                          "(ranks sharing a GPU would measure contention, not the framework)")
