"""GPU telemetry over NVML (nvidia-ml-py), sampled in a background thread while the training
loop runs: utilisation, SM clock, power and the board's energy counter, so a result says what
the GPU did (H100 PCIe vs SXM, a throttled node) and what the run cost in joules.

The thread only reads NVML; the runner starts it before the loop and stops it after, so nothing
here is inside a step. On CPU runs, or where NVML cannot start, the result says why instead.
Not yet run on a GPU: the NVML calls are the documented nvidia-ml-py API, exercised here
against a stand-in module (tests/test_nvml.py).
"""
from __future__ import annotations

import threading
import time
from typing import Optional


def _load_nvml():
    import pynvml  # nvidia-ml-py
    return pynvml


def nvml_uuid(cuda_uuid) -> Optional[str]:
    """torch's device uuid -> NVML's form ('GPU-' + the uuid), or None."""
    if not cuda_uuid:
        return None
    text = str(cuda_uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def for_device(device, interval_s: float = 0.1) -> Optional["NvmlSampler"]:
    """A started sampler for a CUDA device, None on CPU."""
    if device.type != "cuda":
        return None
    import torch
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return NvmlSampler(device.index or 0, nvml_uuid(uuid), interval_s).start()


def summarize(samples: list[dict], energy_mj: Optional[tuple[int, int]], seconds: float) -> dict:
    """Samples [{util, sm_mhz, power_w}] and the energy counter at start and stop (mJ) -> the
    record's numbers. Energy from the counter where the board has one, else power integrated
    over the sampled interval (mean power x seconds), and which it was."""
    def stats(key):
        vals = [s[key] for s in samples if s.get(key) is not None]
        if not vals:
            return None
        return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}
    power = stats("power_w")
    if energy_mj is not None:
        energy, source = (energy_mj[1] - energy_mj[0]) / 1000.0, "nvmlDeviceGetTotalEnergyConsumption"
    elif power is not None:
        energy, source = power["mean"] * seconds, "mean sampled power x seconds"
    else:
        energy, source = None, None
    return {"samples": len(samples), "seconds": seconds, "utilization_pct": stats("util"),
            "sm_clock_mhz": stats("sm_mhz"), "power_w": power, "energy_j": energy, "energy_source": source}


def counter_at(points: list[tuple[float, float]], t: float) -> Optional[float]:
    """The energy counter (mJ) at time t, linearly interpolated between the readings around it
    [(time, mJ)], or None where t is outside them."""
    pts = sorted(points)
    for (t0, e0), (t1, e1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return e0 if t1 == t0 else e0 + (e1 - e0) * (t - t0) / (t1 - t0)
    return pts[0][1] if len(pts) == 1 and pts[0][0] == t else None


def window_energy(points: list[tuple[float, float]], samples: list[dict], window: Optional[tuple[float, float]]) -> dict:
    """Joules of the measured window only (warm-up, compile and the probes after it excluded): the
    board's counter read with each sample, interpolated at the window's start and end; without a
    counter, the mean power of the samples inside the window x its length."""
    if not window or window[0] is None or window[1] is None or window[1] <= window[0]:
        return {"window_energy_j": None, "window_s": None, "window_energy_source": "no measured window"}
    start, end = window
    e0, e1 = counter_at(points, start), counter_at(points, end)
    if e0 is not None and e1 is not None:
        return {"window_energy_j": (e1 - e0) / 1000.0, "window_s": end - start,
                "window_energy_source": "energy counter interpolated at the window's start and end"}
    inside = [s["power_w"] for s in samples if s.get("power_w") is not None and start <= s.get("t", -1) <= end]
    if inside:
        return {"window_energy_j": sum(inside) / len(inside) * (end - start), "window_s": end - start,
                "window_energy_source": f"mean power of the {len(inside)} samples inside the window x its length"}
    return {"window_energy_j": None, "window_s": end - start, "window_energy_source": "no reading inside the window"}


class NvmlSampler:
    """Samples one GPU every `interval_s` in a daemon thread between start() and stop()."""

    def __init__(self, index: int, uuid: Optional[str] = None, interval_s: float = 0.1, nvml=None):
        self.index, self.uuid, self.interval_s = index, uuid, interval_s
        self.nvml, self.handle, self.reason = nvml, None, None
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._energy0 = None
        self._t0 = 0.0
        self.points: list[tuple[float, float]] = []    # (perf_counter, energy counter mJ)

    def _open(self) -> bool:
        try:
            self.nvml = self.nvml or _load_nvml()
            self.nvml.nvmlInit()
            if self.uuid:   # the CUDA device's own board, whatever CUDA_VISIBLE_DEVICES renumbered
                self.handle = self.nvml.nvmlDeviceGetHandleByUUID(self.uuid)
            else:
                self.handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
            return True
        except Exception as exc:  # no library, no driver, no permission: say so, measure nothing
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return False

    def _energy(self) -> Optional[int]:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    def _sample(self) -> dict:
        out = {"t": time.perf_counter()}     # the runner's clock: the window is in it
        for key, read in (("util", lambda: self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu),
                          ("sm_mhz", lambda: self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)),
                          ("power_w", lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0)):
            try:
                out[key] = read()
            except Exception:
                out[key] = None
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self._sample())
            self._read_counter()

    def _read_counter(self) -> None:
        energy = self._energy()
        if energy is not None:
            self.points.append((time.perf_counter(), energy))

    def start(self) -> "NvmlSampler":
        if not self._open():
            return self
        self._t0 = time.monotonic()
        self._energy0 = self._energy()
        if self._energy0 is not None:
            self.points.append((time.perf_counter(), self._energy0))
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, window: Optional[tuple[float, float]] = None) -> dict:
        """The loop's summary; `window`: the measured window (perf_counter start, end) whose energy is
        reported apart from the loop's."""
        if self._thread is None:
            return {"available": False, "reason": self.reason}
        self._stop.set()
        self._thread.join()
        self.samples.append(self._sample())   # at least one sample, even for a short loop
        seconds = time.monotonic() - self._t0
        end = self._energy()
        if end is not None:
            self.points.append((time.perf_counter(), end))
        energy = (self._energy0, end) if self._energy0 is not None and end is not None else None
        windowed = window_energy(self.points, self.samples, window)
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass
        return {"available": True, "interval_s": self.interval_s, **summarize(self.samples, energy, seconds),
                **windowed}
