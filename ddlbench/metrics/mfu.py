"""Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B)."""
from __future__ import annotations


class MfuError(ValueError):
    """An MFU above 100% means a wrong FLOP count or peak: an error, not a result."""


def mfu(flops_per_sample: float, samples_per_s: float, devices: int, peak_flops_per_device: float) -> float:
    """achieved model FLOP/s / (devices * peak FLOP/s)."""
    if devices < 1 or peak_flops_per_device <= 0:
        raise ValueError("devices must be >= 1 and peak > 0")
    value = flops_per_sample * samples_per_s / (devices * peak_flops_per_device)
    if value > 1.0:
        raise MfuError(f"MFU {value:.1%} > 100%: FLOPs per sample ({flops_per_sample:.3g}) or the "
                       f"device peak ({peak_flops_per_device:.3g} FLOP/s) is wrong")
    return value
