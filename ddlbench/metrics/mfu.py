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


# Dense float8 tensor-core peak over dense bf16 on the GPUs float8 training runs on (H100 and H200
# SXM: 1,979 and 989.4 TFLOP/s; Ada and Blackwell keep the same 2:1)
FP8_OVER_BF16 = 2.0


def float8_share(float8_linear_params: int, tokens_per_sample: int, train_flops_per_sample: float) -> float:
    """The share of a training step's FLOPs that run as float8 matmuls: 6 x the converted linear
    layers' weights per token (forward, and the two backward matmuls), over the step's FLOPs."""
    return 6.0 * float8_linear_params * tokens_per_sample / train_flops_per_sample


def float8_weighted_mfu(mfu_bf16: float, share: float, fp8_over_bf16: float = FP8_OVER_BF16) -> float:
    """MFU on a FLOP-weighted peak: the float8 share of the FLOPs at the fp8 peak, the rest at the
    bf16 peak. peak_w = 1 / (share / P8 + (1 - share) / P16), so MFU_w = MFU_16 x (share / r + 1 - share)
    with r = P8 / P16. (torchtitan publishes no MFU for float8 runs; this says what the bf16 figure
    leaves out.)"""
    return mfu_bf16 * (share / fp8_over_bf16 + 1.0 - share)
