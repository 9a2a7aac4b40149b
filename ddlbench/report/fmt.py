"""Formatting shared by the report's writers (render, verdict): what counts as no value, and bytes
for a person."""
from __future__ import annotations

import math


def missing(x) -> bool:
    """None or NaN (pandas gives NaN where a record has no value)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def human_bytes(n) -> str:
    if missing(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"
