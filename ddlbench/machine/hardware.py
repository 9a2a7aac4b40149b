"""Peak FLOP/s per device for MFU: the GPU table in conf/hardware, or a CPU matmul probe
cached per machine, thread count and dtype."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Optional

import torch

from ddlbench.record.results import atomic_write_json

CACHE = Path.home() / ".cache" / "ddlbench" / "cpu_peak.json"
GPU_CACHE = Path.home() / ".cache" / "ddlbench" / "gpu_peak.json"
# n x n x n products whose best rate is the measured GPU peak: on an H200 (bf16, CUDA events)
# 4096 gave 790-793 TFLOP/s, 8192 720-748, 16384 672-675 (reports/gpu-h200/2026-11-26)
GPU_PROBE_SHAPES = (4096, 8192, 16384)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_cpu_matmul(threads: int, dtype: torch.dtype = torch.float32, n: int = 1024,
                     seconds: float = 1.0) -> float:
    """Best sustained FLOP/s of an n x n matmul with `threads` threads (2 n^3 FLOPs each)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        for _ in range(3):
            a @ b
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            for _ in range(4):
                a @ b
            best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
        return best
    finally:
        torch.set_num_threads(before)


CONV_ARCHS = ("resnet18", "resnet50", "resnet152", "vgg16")   # whose FLOPs are mostly convolutions


def peak_dtype(device_type: str, precision: str, tf32: bool = False) -> str:
    """Which dense peak bounds a run's math. bf16/fp16 as run. fp32 on CUDA: the TF32 tensor-core
    peak when the model's main op may use TF32 (`tf32`: cuDNN convolutions do by default,
    matmuls only with torch.backends.cuda.matmul.allow_tf32), else the FP32 peak. On CPU the
    probe measures bf16 or fp32 (fp16 runs are bounded by the fp32 probe)."""
    if device_type == "cuda":
        return "tf32" if precision == "fp32" and tf32 else precision
    return "bf16" if precision == "bf16" else "fp32"


def cuda_tf32_enabled(arch: Optional[str]) -> bool:
    """Whether fp32 math of this model may run as TF32 on CUDA right now (torch's flags)."""
    if arch in CONV_ARCHS:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32)


def match_gpu(name: str, table: dict):
    """The gpu_table key for a device name: the longest key that appears as whole words
    ('H100 PCIe' before 'H100'; 'A10' does not match 'A10G'); a space in a key matches spaces,
    '-' or '_' ('V100 PCIe' matches 'Tesla V100-PCIE-32GB'). None if none does."""
    import re

    def pattern(key: str) -> str:
        return r"[\s_-]+".join(re.escape(word) for word in key.split())
    hits = [k for k in table if re.search(rf"(?<![\w]){pattern(k)}(?![\w])", name, re.IGNORECASE)]
    return max(hits, key=len) if hits else None


def matmul_rate(n: int, reps: int, elapsed_ms: float) -> float:
    """FLOP/s of `reps` n x n x n products (2 n^3 FLOPs each) in elapsed_ms."""
    return 2 * n**3 * reps / (elapsed_ms / 1e3)


def probe_gpu_matmul(device: torch.device, dtype: torch.dtype, tf32: bool = False,
                     shapes=GPU_PROBE_SHAPES, reps: int = 20) -> float:
    """Best rate over `shapes`, timed with CUDA events (kernel time, not host time), after three
    warm-up products each; a shape that does not fit beside the run's memory is skipped."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    best = 0.0
    try:
        for n in shapes:
            try:
                a = torch.randn(n, n, device=device, dtype=dtype)
                b = torch.randn(n, n, device=device, dtype=dtype)
            except torch.cuda.OutOfMemoryError:
                continue
            for _ in range(3):
                a @ b
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            end.synchronize()
            best = max(best, matmul_rate(n, reps, start.elapsed_time(end)))
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return best


def gpu_probe_args(key: str) -> tuple[torch.dtype, bool]:
    """(dtype, allow TF32) of the probe for a peak_dtype key."""
    return {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False), "tf32": (torch.float32, True),
            "fp32": (torch.float32, False)}[key]


def measured_gpu_peak(device: torch.device, key: str, cache: Path = GPU_CACHE) -> tuple[float, str]:
    """The matmul peak measured on this GPU model for a peak_dtype key, cached per host, GPU name
    and key (one probe per machine, not per run)."""
    key_str = f"{platform.node()}|{torch.cuda.get_device_name(device)}|{key}"
    table = _read(cache)
    if not table.get(key_str):
        table[key_str] = probe_gpu_matmul(device, *gpu_probe_args(key))
        _write(cache, table)
    return table[key_str], f"matmul probe, CUDA events, best of n={','.join(map(str, GPU_PROBE_SHAPES))} ({key_str})"


def _read(cache: Path) -> dict:
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}


def _write(cache: Path, table: dict) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache, table)
    except OSError:
        pass  # an unwritable cache only costs a re-probe


def cpu_peak(threads: int, precision: str, cache: Path = CACHE) -> tuple[float, str]:
    dtype = torch.bfloat16 if peak_dtype("cpu", precision) == "bf16" else torch.float32
    key = f"{platform.node()}|{cpu_model()}|threads={threads}|{dtype}"
    table = _read(cache)
    if key not in table:
        table[key] = probe_cpu_matmul(threads, dtype)
        _write(cache, table)
    return table[key], f"cpu matmul probe ({key})"


def peak_flops(hw_cfg, device: torch.device, precision: str, threads: int,
               tf32: bool = False) -> tuple[Optional[float], str]:
    """(dense peak FLOP/s per device for peak_dtype(...), where it came from)."""
    key = peak_dtype(device.type, precision, tf32)
    if hw_cfg.peak_flops is not None:
        return getattr(hw_cfg.peak_flops, key), f"conf/hardware/{hw_cfg.name} {key}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        gpu = match_gpu(name, hw_cfg.gpu_table)
        if gpu is None:
            return None, f"no peak known for '{name}': add it to conf/hardware/auto.yaml gpu_table"
        return getattr(hw_cfg.gpu_table[gpu], key), f"conf/hardware gpu_table[{gpu}] {key} for '{name}'"
    return cpu_peak(threads, precision)
