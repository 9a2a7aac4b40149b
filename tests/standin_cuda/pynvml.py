"""A stand-in NVML (nvidia-ml-py's API) for the stand-in CUDA's machine: one H100. NVML never
creates a CUDA context, so nothing here is recorded."""
from types import SimpleNamespace

from standin_cuda import PROPS

NVML_CLOCK_SM = 1


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    if i != 0:
        raise NVMLError("invalid argument")
    return "handle0"


def nvmlDeviceGetUUID(_h):
    return "GPU-" + PROPS.uuid


def nvmlDeviceGetName(_h):
    return PROPS.name


def nvmlDeviceGetCudaComputeCapability(_h):
    return PROPS.major, PROPS.minor


def nvmlDeviceGetMemoryInfo(_h):
    return SimpleNamespace(total=PROPS.total_memory, free=PROPS.total_memory, used=0)


def nvmlSystemGetCudaDriverVersion():
    return 13000
