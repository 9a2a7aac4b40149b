"""The GPUs this process can see, asked without creating a CUDA context.

The launcher, the sweep and `bench advise` decide a run's device and precision (run.device=auto,
run.precision=auto) and then fork: cells from the sweep, the elastic agent from the launcher. A
child forked after its parent initialised CUDA cannot use the GPU ("Cannot re-initialize CUDA in
forked subprocess"; `torch.cuda.is_available()` alone initialises the driver, and
`torch.cuda.is_bf16_supported()` torch's whole CUDA state). So these processes never ask CUDA:
- NVML (the driver's management library, nvidia-ml-py) gives the count (CUDA_VISIBLE_DEVICES
  applied), compute capability, name and memory of each GPU, and the CUDA version the driver
  supports, with no CUDA context;
- no NVML library and no CUDA driver library: no GPU (a CPU machine, a container started without
  GPUs);
- anything else (ROCm, MIG, NVML failing beside a driver): a fresh interpreter asks torch.cuda
  and exits, taking its CUDA context with it.
Only the ranks themselves (spawned on GPUs) call torch.cuda directly.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    total_memory: int           # bytes


@dataclass(frozen=True)
class GpuInfo:
    gpus: tuple[Gpu, ...] = ()
    source: str = ""            # how it was learnt (NVML, a probe process, no driver)
    hip: bool = False
    unusable: Optional[str] = None   # GPUs present but CUDA cannot use them (driver too old), why
    driver_cuda: Optional[int] = None    # the CUDA version the driver supports (NVML: 12040 = 12.4)

    @property
    def count(self) -> int:
        return 0 if self.unusable else len(self.gpus)

    @property
    def available(self) -> bool:
        return self.count > 0

    @property
    def min_memory(self) -> Optional[int]:
        return min((g.total_memory for g in self.gpus), default=None)

    @property
    def min_capability(self) -> Optional[tuple[int, int]]:
        return min((tuple(g.capability) for g in self.gpus), default=None)


def bf16_native(capabilities: list[tuple[int, int]], hip: bool = False) -> bool:
    """bf16 in hardware on every device: compute capability 8.0 (Ampere) or later; ROCm devices
    as torch counts them (torch.cuda.is_bf16_supported: always). Not torch's default
    is_bf16_supported(), which also counts emulation (a V100 or T4 'supports' bf16 at a
    fraction of its fp32 speed)."""
    if hip:
        return True
    return bool(capabilities) and all(major >= 8 for major, _ in capabilities)


def driver_too_old(driver_cuda: Optional[int], torch_cuda: Optional[str]) -> Optional[str]:
    """Why a driver supporting CUDA `driver_cuda` (NVML's form: 12040 = 12.4) cannot run torch
    built for CUDA `torch_cuda` ('13.0'), or None. Within one major version CUDA's minor-version
    compatibility lets an older driver run the build."""
    if not driver_cuda or not torch_cuda:
        return None
    major = driver_cuda // 1000
    built = int(torch_cuda.split(".")[0])
    if major < built:
        return (f"the driver supports CUDA {major}.{driver_cuda % 1000 // 10}, torch is built for CUDA "
                f"{torch_cuda}: update the driver or install a torch build for CUDA {major}")
    return None


def visible_indices(cvd: Optional[str], uuids: list[str]) -> Optional[list[int]]:
    """NVML indices of the devices CUDA_VISIBLE_DEVICES makes visible, in its order; None where
    only CUDA can tell (MIG instances). CUDA's own rules: unset = all; the list ends at the first
    entry that names no device; a uuid may be given by a unique prefix."""
    if cvd is None:
        return list(range(len(uuids)))
    out: list[int] = []
    for entry in (e.strip() for e in cvd.split(",")):
        if entry.startswith("MIG"):
            return None
        if entry.lstrip("-").isdigit():
            idx = int(entry)
            if idx < 0 or idx >= len(uuids) or idx in out:
                break
            out.append(idx)
            continue
        if not entry.startswith("GPU-"):
            break
        match = [i for i, u in enumerate(uuids) if u.startswith(entry)]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def from_nvml(nvml, environ=os.environ) -> Optional[GpuInfo]:
    """The visible GPUs from an initialisable NVML module (pynvml), or None where it cannot say."""
    try:
        nvml.nvmlInit()
    except Exception:   # no library, no driver: NVML cannot say
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        indices = visible_indices(environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        if indices is None:
            return None
        gpus = tuple(Gpu(_text(nvml.nvmlDeviceGetName(handles[i])),
                         tuple(nvml.nvmlDeviceGetCudaComputeCapability(handles[i])),
                         int(nvml.nvmlDeviceGetMemoryInfo(handles[i]).total)) for i in indices)
        driver = int(nvml.nvmlSystemGetCudaDriverVersion())
    except Exception:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    import torch
    return GpuInfo(gpus, "NVML", unusable=driver_too_old(driver, torch.version.cuda) if gpus else None,
                   driver_cuda=driver)


PROBE = """
import json, torch
out = {"available": torch.cuda.is_available(), "hip": bool(torch.version.hip), "gpus": []}
for i in range(torch.cuda.device_count() if out["available"] else 0):
    p = torch.cuda.get_device_properties(i)
    out["gpus"].append({"name": p.name, "capability": [p.major, p.minor], "total_memory": p.total_memory})
print(json.dumps(out))
"""


def from_probe_process(timeout_s: float = 120) -> GpuInfo:
    """Ask torch.cuda in a fresh interpreter: its CUDA context ends with it, this process stays
    fork-safe."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        raw = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        return GpuInfo((), "probe process", unusable=f"the CUDA probe process failed: {exc}")
    gpus = tuple(Gpu(g["name"], tuple(g["capability"]), int(g["total_memory"])) for g in raw["gpus"])
    return GpuInfo(gpus, "probe process", hip=raw["hip"])


def driver_library_present() -> bool:
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def visible_gpus() -> GpuInfo:
    """What this process's ranks will find, learnt without a CUDA context here (cached: a
    forked child inherits the answer)."""
    import torch
    if torch.version.hip:
        return from_probe_process()
    if not torch.backends.cuda.is_built():
        return GpuInfo((), "torch built without CUDA")
    try:
        import pynvml
    except ImportError:
        pynvml = None
    info = from_nvml(pynvml) if pynvml is not None else None
    if info is not None:
        return info
    if not driver_library_present():
        return GpuInfo((), "no CUDA driver (libcuda.so.1 not found)")
    return from_probe_process()
