"""GPU machines without a GPU: the processes that fork (sweep, launcher, advise) learn the GPUs
from NVML and never initialise CUDA (ddlbench/machine/gpus.py); run.precision=auto counts bf16 only where
the hardware has it.

The guard runs a two-cell sweep and a `bench advise` in fresh interpreters under a stand-in CUDA
(tests/standin_cuda: one H100 behind torch.cuda and NVML, every CUDA initialisation and fork
recorded per process) and fails if a process forked after initialising CUDA. Each cell must get
as far as its rank's torch.cuda.set_device, where the stand-in stops it."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, bench_exe, for_runs

from ddlbench.machine.gpus import Gpu, bf16_native, driver_too_old, from_nvml, visible_indices

STANDIN = REPO / "tests" / "standin_cuda"


def test_bf16_only_where_the_hardware_has_it():
    assert bf16_native([(8, 0)]) and bf16_native([(9, 0), (9, 0)]) and bf16_native([(12, 0)])
    assert not bf16_native([(7, 0)])             # V100: torch's is_bf16_supported() says True (emulated)
    assert not bf16_native([(7, 5)])             # T4
    assert not bf16_native([(9, 0), (7, 0)])     # a mixed node: the slowest decides
    assert not bf16_native([])
    assert bf16_native([], hip=True)             # ROCm: torch's rule


def test_driver_too_old_for_the_torch_build():
    assert driver_too_old(12040, "13.0") == ("the driver supports CUDA 12.4, torch is built for CUDA 13.0: "
                                             "update the driver or install a torch build for CUDA 12")
    assert driver_too_old(13000, "13.0") is None
    assert driver_too_old(13020, "13.0") is None
    assert driver_too_old(12020, "12.8") is None  # minor-version compatibility
    assert driver_too_old(None, "13.0") is None and driver_too_old(12040, None) is None


def test_cuda_visible_devices_as_cuda_reads_it():
    uuids = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3", "GPU-dddd-4"]
    assert visible_indices(None, uuids) == [0, 1, 2, 3]
    assert visible_indices("", uuids) == []
    assert visible_indices("2,0", uuids) == [2, 0]
    assert visible_indices("1,7,2", uuids) == [1]           # the list ends at a device that does not exist
    assert visible_indices("0,-1,2", uuids) == [0]
    assert visible_indices("GPU-cccc,GPU-a", uuids) == [2, 0]  # unique uuid prefixes
    assert visible_indices("GPU-,1", uuids) == []            # ambiguous prefix
    assert visible_indices("MIG-123", uuids) is None         # only CUDA can tell


class FakeNvml:
    """NVML's API over a list of (name, capability, GiB, uuid)."""

    def __init__(self, devices, driver=13000, fail=False):
        self.devices, self.driver, self.fail, self.closed = devices, driver, fail, False

    def nvmlInit(self):
        if self.fail:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    def nvmlShutdown(self):
        self.closed = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h][3].encode()      # older nvidia-ml-py returns bytes

    def nvmlDeviceGetName(self, h):
        return self.devices[h][0]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.devices[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.devices[h][2] << 30)

    def nvmlSystemGetCudaDriverVersion(self):
        return self.driver


def test_gpus_from_nvml():
    node = [("Tesla V100-SXM2-32GB", (7, 0), 32, "GPU-v100-0"), ("NVIDIA H100 80GB HBM3", (9, 0), 80, "GPU-h100-1")]
    nvml = FakeNvml(node)
    info = from_nvml(nvml, {"CUDA_VISIBLE_DEVICES": "1"})
    assert info.gpus == (Gpu("NVIDIA H100 80GB HBM3", (9, 0), 80 << 30),) and info.count == 1 and nvml.closed
    both = from_nvml(FakeNvml(node), {})
    assert both.count == 2 and both.min_memory == 32 << 30 and both.source == "NVML"
    assert from_nvml(FakeNvml(node), {"CUDA_VISIBLE_DEVICES": ""}).available is False
    assert from_nvml(FakeNvml(node, fail=True), {}) is None                  # no NVML: it cannot say
    assert from_nvml(FakeNvml(node), {"CUDA_VISIBLE_DEVICES": "MIG-1"}) is None
    old = from_nvml(FakeNvml(node, driver=11080), {})
    assert not old.available and old.count == 0 and "the driver supports CUDA 11.8" in old.unusable


def test_precision_auto_from_nvml(monkeypatch):
    """planned_precision asks ddlbench.machine.gpus (NVML), never torch.cuda: a V100 node runs fp32."""
    import ddlbench.machine.gpus as gpus
    from ddlbench.machine.device import planned_precision
    from ddlbench.machine.gpus import GpuInfo
    for caps, want in (([(9, 0)], "bf16"), ([(7, 0)], "fp32"), ([(7, 5), (7, 5)], "fp32"), ([], "fp32")):
        info = GpuInfo(tuple(Gpu("g", c, 1) for c in caps), "test")
        monkeypatch.setattr(gpus, "visible_gpus", lambda info=info: info)
        assert planned_precision({"precision": "auto", "device": "auto"}) == want
        assert planned_precision({"precision": "auto", "device": "cpu"}) == "fp32"


def test_this_machine_has_no_gpu_and_asks_no_cuda():
    from ddlbench.machine.gpus import visible_gpus
    info = visible_gpus()
    assert not info.available and info.source in ("no CUDA driver (libcuda.so.1 not found)", "torch built without CUDA")


def standin_env(log: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "DDLBENCH_STANDIN_CUDA": str(log)}


def _standin_module():
    """tests/standin_cuda/standin_cuda.py for its event reader (not installed in this process)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("standin_cuda", STANDIN / "standin_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _records(root: Path) -> list[dict]:
    """The result records under a sweep directory (earlier attempts left out)."""
    return [json.loads(p.read_text()) for p in sorted(root.rglob("result.json")) if ".attempts" not in p.parts]


@pytest.mark.slow
def test_no_process_that_forks_initialises_cuda(tmp_path):
    """A two-cell sweep and a `bench advise` on the stand-in GPU machine. Before ddlbench.machine.gpus the
    sweep process called torch.cuda.is_bf16_supported() (run.precision=auto) and every forked
    cell died at its own validation with "Cannot re-initialize CUDA in forked subprocess"."""
    standin_check = _standin_module()
    log = tmp_path / "cuda_events.jsonl"
    env = standin_env(log)
    sweep = tmp_path / "sweep"
    proc = bench_exe("sweep", "--dir", str(sweep), "framework=ddp", "model=gpt2_tiny", "launcher.nproc=1",
                     "debug=fast", "run.global_batch=2,4", "run.timeout_s=120", env=env, timeout=for_runs(2, 130))
    advise = tmp_path / "advise"
    proc_a = bench_exe("advise", "model=gpt2_tiny", "devices=1", "frameworks=ddp", "calibrate=ddp",
                       "micro_batches=[2]", "global_batch=2", "budget_runs=1", "logger=none", f"dir={advise}",
                       "run.timeout_s=120", env=env, timeout=for_runs(3, 130))
    assert standin_check.violations(log) == []
    ev = standin_check.events(log)
    assert any(e["event"] == "fork" for e in ev)                     # the guard saw the forks it guards
    assert any(e["event"] == "cuda_init" for e in ev)                # and the ranks that used CUDA
    cells = _records(sweep)
    assert len(cells) == 2, proc.stdout + proc.stderr
    for rec in cells:     # every cell: validated, launched and spawned its rank, which asked for its GPU
        assert rec["status"] == "failed" and standin_check.STOP_MESSAGE in rec["error"]["message"], rec["error"]
        assert rec["precision"] == "bf16" and rec["config"]["run"]["precision"] == "auto"
    assert proc.returncode == 1
    calib = _records(advise / "calibration")
    assert calib and all(standin_check.STOP_MESSAGE in r["error"]["message"] for r in calib)
    assert proc_a.returncode == 2 and "the DDP calibration run failed" in proc_a.stderr, proc_a.stdout + proc_a.stderr
