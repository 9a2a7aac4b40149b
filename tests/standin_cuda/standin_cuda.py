"""A stand-in for a GPU machine's CUDA, for the fork-safety guard (tests/test_gpu_fork.py).

torch.cuda is replaced by functions that behave, as far as process state goes, like the real
ones on a machine with one H100: asking CUDA (`is_available`, which initialises the driver, and
everything that lazily initialises torch's CUDA state) marks this process initialised; a child
forked from an initialised process raises torch's own error at its first CUDA call ("Cannot
re-initialize CUDA in forked subprocess"); `device_count` answers from NVML without
initialising, as torch's does. `set_device` is where a rank would start using the GPU: there the
stand-in stops the rank with STOP_MESSAGE (no GPU is behind it).

Every initialisation and every fork is appended to the event log as a JSON line
{proc, parent, pid, event, what}; `violations(log)` lists the processes that forked after
initialising CUDA, or used it in a forked child of such a process.
"""
from __future__ import annotations

import json
import os
import types
import uuid

STOP_MESSAGE = "stand-in CUDA: no GPU behind it (the rank reached torch.cuda.set_device)"
REINIT = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
          "the 'spawn' start method")
GiB = 1 << 30
PROPS = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3 (stand-in)", major=9, minor=0, total_memory=80 * GiB,
                              multi_processor_count=132, uuid="00000000-0000-0000-0000-000000000001")

_state = {"log": None, "proc": None, "parent": None, "initialized": False, "bad_fork": False}


def _record(event: str, what: str = "") -> None:
    line = json.dumps({"proc": _state["proc"], "parent": _state["parent"], "pid": os.getpid(),
                       "event": event, "what": what}) + "\n"
    fd = os.open(_state["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _touch(what: str) -> None:
    if _state["bad_fork"]:
        _record("used_in_forked_child", what)
        raise RuntimeError(REINIT)
    if not _state["initialized"]:
        _state["initialized"] = True
        _record("cuda_init", what)


def _before_fork() -> None:
    _record("fork")


def _after_fork_in_child() -> None:
    _state["parent"], _state["proc"] = _state["proc"], uuid.uuid4().hex[:12]
    _state["bad_fork"] = _state["bad_fork"] or _state["initialized"]
    _state["initialized"] = False


def install(log: str) -> None:
    import torch
    _state.update(log=log, proc=uuid.uuid4().hex[:12])
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    cuda = torch.cuda

    def touching(what, value):
        def f(*_a, **_k):
            _touch(what)
            return value() if callable(value) else value
        return f

    def set_device(*_a, **_k):
        _touch("set_device")
        raise RuntimeError(STOP_MESSAGE)

    touch_available = touching("is_available", True)                # cudaGetDeviceCount: the driver
    # with PYTORCH_NVML_BASED_CUDA_CHECK=1 torch answers from NVML's device count: no initialisation
    cuda.is_available = lambda: (True if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"
                                 else touch_available())
    cuda._lazy_init = touching("_lazy_init", None)
    cuda.init = touching("init", None)
    cuda.is_bf16_supported = touching("is_bf16_supported", True)
    cuda.current_device = touching("current_device", 0)
    cuda.get_device_properties = touching("get_device_properties", PROPS)
    cuda.get_device_capability = touching("get_device_capability", (PROPS.major, PROPS.minor))
    cuda.get_device_name = touching("get_device_name", PROPS.name)
    cuda.synchronize = touching("synchronize", None)
    cuda.mem_get_info = touching("mem_get_info", (PROPS.total_memory, PROPS.total_memory))
    cuda.set_device = set_device
    cuda.device_count = lambda: 1                                       # NVML: no initialisation
    cuda.is_initialized = lambda: _state["initialized"]


def events(log) -> list[dict]:
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def violations(log) -> list[str]:
    """Processes that forked after initialising CUDA, and forked children that used it."""
    out, initialised = [], {}
    for e in events(log):
        if e["event"] == "cuda_init":
            initialised.setdefault(e["proc"], e["what"])
        elif e["event"] == "fork" and e["proc"] in initialised:
            out.append(f"process {e['proc']} (pid {e['pid']}) forked after CUDA was initialised "
                       f"by {initialised[e['proc']]}")
        elif e["event"] == "used_in_forked_child":
            out.append(f"process {e['proc']} (pid {e['pid']}), forked from an initialised process, called {e['what']}")
    return sorted(set(out))
