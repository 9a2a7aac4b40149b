"""GPU telemetry (ddlbench/machine/nvml.py) against a stand-in for nvidia-ml-py, and the CPU path."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ddlbench.machine.nvml import NvmlSampler, nvml_uuid, summarize
from ddlbench.rank.sections import gpu_telemetry


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, energy=(5_000_000, 5_750_000), power_mw=250_000):
        self.energy, self.power_mw, self.calls = list(energy), power_mw, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(uuid)
        return "h"

    def nvmlDeviceGetHandleByIndex(self, i):
        return "h"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90)

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1755

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy.pop(0) if len(self.energy) > 1 else self.energy[0]

    def nvmlShutdown(self):
        self.calls.append("shutdown")


def test_summary_by_hand():
    s = summarize([{"util": 80, "sm_mhz": 1700, "power_w": 200.0}, {"util": 100, "sm_mhz": 1500, "power_w": 300.0}],
                  (1_000_000, 1_500_000), 2.0)
    assert s["utilization_pct"] == {"mean": 90.0, "min": 80, "max": 100}
    assert s["energy_j"] == 500.0 and s["energy_source"] == "nvmlDeviceGetTotalEnergyConsumption"
    # no energy counter: mean power x time
    assert summarize([{"power_w": 200.0}, {"power_w": 300.0}], None, 2.0)["energy_j"] == 500.0


def test_sampler_thread_reads_the_board_by_uuid():
    nvml = FakeNvml()
    sampler = NvmlSampler(0, nvml_uuid("8f0c-1"), interval_s=0.01, nvml=nvml).start()
    time.sleep(0.05)
    out = sampler.stop()
    assert out["available"] and out["samples"] >= 1 and out["sm_clock_mhz"]["max"] == 1755
    assert out["power_w"]["mean"] == 250.0 and out["energy_j"] == 750.0
    assert nvml.calls[:2] == ["init", "GPU-8f0c-1"] and nvml.calls[-1] == "shutdown"
    assert nvml_uuid("GPU-abc") == "GPU-abc" and nvml_uuid(None) is None


def test_without_nvml_the_reason_is_kept():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    out = NvmlSampler(0, interval_s=0.01, nvml=Broken()).start().stop()
    assert out == {"available": False, "reason": "NVML unavailable: OSError: libnvidia-ml.so.1: cannot open "
                                                  "shared object file"}


def test_energy_per_sample_over_ranks_is_the_windows():
    ranks = [{"available": True, "energy_j": 100.0, "window_energy_j": 60.0, "steps": 10, "measured_steps": 8},
             {"available": True, "energy_j": 140.0, "window_energy_j": 90.0, "steps": 10, "measured_steps": 8}]
    out = gpu_telemetry(ranks, global_batch=8)
    assert out["energy_j"] == 240.0 and out["window_energy_j"] == 150.0
    assert out["energy_per_sample_j"] == pytest.approx(150.0 / (8 * 8))   # warm-up's 2 steps and their joules out
    cpu = gpu_telemetry([{"available": False, "reason": "cpu run", "steps": 3}] * 2, 8)
    assert cpu["available"] is False and cpu["reason"] == "cpu run"


def test_window_energy_from_the_counter_by_hand():
    from ddlbench.machine.nvml import counter_at, window_energy
    points = [(0.0, 0.0), (1.0, 1000.0), (3.0, 5000.0)]     # 1 W, then 2 W (mJ per s)
    assert counter_at(points, 2.0) == 3000.0 and counter_at(points, 4.0) is None
    out = window_energy(points, [], (0.5, 2.5))
    assert out["window_energy_j"] == pytest.approx((4000.0 - 500.0) / 1000) and out["window_s"] == 2.0
    # no counter: the mean power of the samples inside the window x its length
    samples = [{"t": 0.2, "power_w": 100.0}, {"t": 1.0, "power_w": 200.0}, {"t": 2.0, "power_w": 300.0}]
    assert window_energy([], samples, (0.5, 2.5))["window_energy_j"] == pytest.approx(250.0 * 2.0)
    assert window_energy(points, samples, (None, 1.0))["window_energy_j"] is None


def test_sampler_leaves_warm_up_and_compile_out_of_the_windows_energy():
    """A stand-in board drawing 1 kW (its counter: 1e6 mJ per second of the runner's clock): the
    window's joules are its length x 1 kW, the loop's more (it began earlier, ended later)."""
    class Kilowatt(FakeNvml):
        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            return int(time.perf_counter() * 1e6)
    sampler = NvmlSampler(0, interval_s=0.01, nvml=Kilowatt()).start()
    time.sleep(0.05)                     # warm-up, compile
    start = time.perf_counter()
    time.sleep(0.1)                      # the measured window
    end = time.perf_counter()
    time.sleep(0.05)                     # the probes after it
    out = sampler.stop(window=(start, end))
    assert out["window_energy_j"] == pytest.approx(1000.0 * (end - start), rel=1e-3)
    assert out["energy_j"] > out["window_energy_j"] + 1000.0 * 0.09
    assert out["window_energy_source"].startswith("energy counter interpolated")
