"""Peak FLOP/s per device for MFU: the GPU table in conf/hardware, or a CPU matmul probe
cached per machine, thread count and dtype."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Optional

import torch

from bench.results import atomic_write_json

CACHE = Path.home() / ".cache" / "ddlbench" / "cpu_peak.json"


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


def cpu_peak(threads: int, precision: str, cache: Path = CACHE) -> tuple[float, str]:
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    key = f"{platform.node()}|{cpu_model()}|threads={threads}|{dtype}"
    try:
        table = json.loads(cache.read_text())
    except (OSError, ValueError):
        table = {}
    if key not in table:
        table[key] = probe_cpu_matmul(threads, dtype)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache, table)
        except OSError:
            pass  # an unwritable cache only costs a re-probe
    return table[key], f"cpu matmul probe ({key})"


def peak_flops(hw_cfg, device: torch.device, precision: str, threads: int) -> tuple[Optional[float], str]:
    """(peak FLOP/s per device, where it came from)."""
    key = "fp32" if precision == "fp32" else precision
    if hw_cfg.peak_flops is not None:
        return getattr(hw_cfg.peak_flops, key), f"conf/hardware/{hw_cfg.name}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for gpu, peaks in hw_cfg.gpu_table.items():
            if gpu.lower() in name.lower():
                return getattr(peaks, key), f"conf/hardware gpu_table[{gpu}] for '{name}'"
        return None, f"no peak known for '{name}': add it to conf/hardware/auto.yaml gpu_table"
    return cpu_peak(threads, precision)
