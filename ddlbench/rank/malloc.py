"""Steady host memory for CPU ranks: glibc's malloc with fixed thresholds instead of its dynamic ones.

glibc serves an allocation above its mmap threshold with a fresh mmap and returns it on free, so
every step that allocates such a buffer (activations, gradients) page-faults it in again. The
threshold starts at 128 KiB and rises when a larger mmapped chunk is freed, so where it ends up
depends on what the process happened to free before training: measured on gpt2_tiny (one rank, 2
threads), the runner's rank took ~2,500 page faults per step and a plain loop's ~80-1,700, and the
runner ran at 0.92 of the plain loop's throughput. Fixed at its maximum (32 MiB) with the trim
threshold at 256 MiB, every process reuses its freed buffers: ~14 faults per step, and the step
time no longer depends on the process's history. Applied alike to every framework's CPU ranks
(and to benchmarks/runner_overhead.py's reference loop) and recorded in result.json
(`env.malloc`). GPU memory is torch's caching allocator's and is not affected."""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20      # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20


_state: dict = {"applied": False, "reason": "not a CPU rank"}


def state() -> dict:
    """What steady() did in this process (result.json env.malloc)."""
    return dict(_state)


def steady() -> dict:
    """Set the thresholds in this process (glibc only); what was done, for the record."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:      # not glibc (musl, macOS): left as it is
        _state.update(applied=False, reason=f"no glibc mallopt ({exc})")
        return state()
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _state.clear()
    _state.update({"applied": ok, "mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD,
            "why": "fixed glibc thresholds: freed host buffers are reused, not page-faulted in again each step "
                   "(ddlbench/rank/malloc.py)"})
    return state()
