"""α and β from measured collective times (`bench commbench`), in the terms of the network model
(ddlbench.network.model), so a fit plugs straight back into it.

The model prices one collective of a full buffer of B bytes over p ranks as
    T = steps(kind, p) * alpha + volume(kind, p) * B / bandwidth
with the ring/tree counts of model.py (all-reduce 2(p-1) steps and 2(p-1)/p B; all-gather,
reduce-scatter and reduce (p-1) and (p-1)/p B; broadcast ceil(log2 p) and B; send 1 and B).
On gloo a reduce-scatter is an all-reduce of the whole input (ProcessGroupGloo; the wire factors
of ddlbench.metrics.comm), so it has the all-reduce's counts (the model's 'gloo' algorithm prices
it the same way). A least-squares line T = a + c B over the measured sizes gives alpha = a / steps
and bandwidth = volume / c (a < 0, which noise at small sizes can give, is refitted through the
origin). Beside it, one line per pair of neighbouring sizes (`segments`): a collective is priced on
the segment its size falls in, so a fit that straddles a non-linearity (on the emulated 100 Mbit/s
link a 4 MiB all-gather takes 1.45x the line through the smaller sizes) does not mis-price the
sizes on either side of it.
"""
from __future__ import annotations

import math

import numpy as np


def coefficients(kind: str, p: int, backend: str | None = None) -> tuple[float, float]:
    """(steps, volume per byte of the full buffer) of the model's cost of `kind` over p ranks."""
    if p < 2:
        raise ValueError("a fit needs at least 2 ranks")
    if backend == "gloo" and kind == "reduce_scatter":
        kind = "all_reduce"
    log2p = math.ceil(math.log2(p))
    table = {"all_reduce": (2 * (p - 1), 2 * (p - 1) / p), "all_gather": (p - 1, (p - 1) / p),
             "reduce_scatter": (p - 1, (p - 1) / p), "reduce": (p - 1, (p - 1) / p),
             "broadcast": (log2p, 1.0), "send": (1, 1.0)}
    if kind not in table:
        raise ValueError(f"no model for {kind}")
    return table[kind]


def _line(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """(a, c) of T = a + c B by least squares; through the origin where a < 0."""
    c, a = np.polyfit(sizes, times, 1)
    if a < 0:                                     # latency not resolvable
        a, c = 0.0, float(sizes @ times / (sizes @ sizes))
    return float(a), float(c)


def fit_alpha_beta(points: list[tuple[float, float]], kind: str, p: int, backend: str | None = None) -> dict:
    """points: [(full-buffer bytes, seconds)], at least 2 distinct sizes. Returns alpha_s,
    bandwidth_Bps (per rank, the model's), the largest relative residual of the fit, and
    `segments`: [{up_to_bytes, alpha_s, bandwidth_Bps}] between neighbouring sizes (the mean time
    at each size; the first reaches down to 0 bytes, the last, up_to_bytes None, up without end;
    a segment whose time does not grow takes the whole fit's line)."""
    sizes = np.array([b for b, _ in points], dtype=float)
    times = np.array([t for _, t in points], dtype=float)
    distinct = sorted(set(sizes.tolist()))
    if len(distinct) < 2:
        raise ValueError("a fit needs at least two message sizes")
    a, c = _line(sizes, times)
    if c <= 0:
        raise ValueError(f"{kind}: time does not grow with size; no bandwidth to fit")
    steps, volume = coefficients(kind, p, backend)
    pred = a + c * sizes
    mean = [float(times[sizes == b].mean()) for b in distinct]
    segments = []
    for i in range(len(distinct) - 1):
        sa, sc = _line(np.array(distinct[i:i + 2]), np.array(mean[i:i + 2]))
        if sc <= 0:
            sa, sc = a, c
        segments.append({"up_to_bytes": int(distinct[i + 1]) if i < len(distinct) - 2 else None,
                         "alpha_s": sa / steps, "bandwidth_Bps": volume / sc})
    return {"kind": kind, "world_size": p, "alpha_s": a / steps, "bandwidth_Bps": volume / c,
            "max_rel_residual": float(np.max(np.abs(pred - times) / times)),
            "sizes": [int(s) for s in sizes], "segments": segments,
            **({"backend": backend} if backend else {})}


def fits(rows: list[dict], world: int, backend: str | None = None, statistic: str = "time_s") -> list[dict]:
    """commbench rows ({kind, bytes, time_s}) -> one fit per kind measured at >= 2 sizes; a kind
    whose times do not grow with size (noise) gets {kind, error} instead of failing the others.
    statistic: the rows' time to fit (time_s, from each rank's median; mean_time_s, from its mean)."""
    by_kind: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append((r["bytes"], r[statistic]))
    out = []
    for kind, pts in by_kind.items():
        if len({b for b, _ in pts}) < 2:
            continue
        try:
            out.append(fit_alpha_beta(pts, kind, world, backend))
        except ValueError as exc:
            out.append({"kind": kind, "world_size": world, "error": str(exc)})
    return out


def fitted_network(base: dict, fit: dict, world: int, others: list[dict] = ()) -> dict:
    """`base` (a conf/network description, as loaded from yaml) with the dimension that the fit's
    ranks spanned given the fit's latency and bandwidth: the outermost dimension the world
    crosses when it fills the network innermost-first (one rank per node on a cluster: the link).
    `others`: fits of other collective kinds at the same world size, kept under `kinds` for that
    dimension with the fit's per-size segments (the main fit's kind too, for its segments):
    ddlbench.network.model.kind_spans prices each kind by its own fit at each message's size."""
    from ddlbench.network.model import from_dict, layout
    used = layout(from_dict(base), world)
    spanned = max((i for i, n in enumerate(used) if n > 1), default=0)
    dims = [dict(d) for d in base["dimensions"]]
    dims[spanned].update(bandwidth_GBps=_g(fit["bandwidth_Bps"] / 1e9), latency_us=_g(fit["alpha_s"] * 1e6))
    kinds = {f["kind"]: {dims[spanned]["name"]: _priced(f)}
             for f in [fit, *others] if "error" not in f and f["world_size"] == world
             and (f["kind"] != fit["kind"] or f.get("segments"))}
    return {**base, "name": f"{base.get('name', 'network')}_fitted", "dimensions": dims,
            "description": f"{base.get('description', '')} -- dimension '{dims[spanned]['name']}' fitted by "
                           f"bench commbench ({fit['kind']}, {world} ranks, sizes {fit['sizes'][0]}.."
                           f"{fit['sizes'][-1]} B)".strip(" -") + (f"; per-kind fits: {', '.join(kinds)}" if kinds else ""),
            "source": "bench commbench (alpha-beta least squares)", **({"kinds": kinds} if kinds else {})}


def add_world_fits(network: dict, others: list[dict], world: int, dimension: str | None = None) -> dict:
    """A fitted network (fitted_network's output) with per-kind fits measured at another number of
    ranks kept beside the first, under kinds[kind][dimension]['by_world'][world]: a collective
    over that many ranks is priced by them on that dimension (default: the outermost, the link
    between nodes; ddlbench.network.model.kind_spans). On `bench cluster` 4 ranks on 2 nodes
    share each node's core and link, which a 2-rank fit does not see."""
    spanned = next((d for d in network["dimensions"] if d["name"] == dimension), None) if dimension \
        else network["dimensions"][-1]
    if spanned is None:
        raise ValueError(f"network {network.get('name')} has no dimension {dimension!r}")
    dim = spanned["name"]
    kinds = {k: {d: dict(v) for d, v in per.items()} for k, per in (network.get("kinds") or {}).items()}
    for f in others:
        if "error" in f or f["world_size"] != world:
            continue
        # a kind without a fit of its own keeps the dimension's price at every other world size
        entry = kinds.setdefault(f["kind"], {}).setdefault(
            dim, {"bandwidth_GBps": spanned["bandwidth_GBps"], "latency_us": spanned["latency_us"]})
        entry["by_world"] = {**entry.get("by_world", {}), world: _priced(f)}
    return {**network, "kinds": kinds,
            "description": f"{network.get('description', '')}; per-kind fits at {world} ranks too".strip("; ")}


def _priced(f: dict) -> dict:
    """A fit as the network description keeps it (GB/s, us; per-size segments where fitted)."""
    out = {"bandwidth_GBps": _g(f["bandwidth_Bps"] / 1e9), "latency_us": _g(f["alpha_s"] * 1e6)}
    if f.get("segments"):
        out["world_size"] = f["world_size"]
        out["segments"] = [{"up_to_bytes": s["up_to_bytes"], "bandwidth_GBps": _g(s["bandwidth_Bps"] / 1e9),
                            "latency_us": _g(s["alpha_s"] * 1e6)} for s in f["segments"]]
    return out


def _g(x: float) -> float:
    return float(f"{x:.6g}")
