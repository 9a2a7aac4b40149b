"""Communication time, overlapped with compute and exposed: interval arithmetic over one profiled
step (ddlbench/comm/exposed.py extracts the intervals from torch.profiler)."""
from __future__ import annotations

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points."""
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    ua, ub, out, i, j = union(a), union(b), [], 0, 0
    while i < len(ua) and j < len(ub):
        s, e = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if e > s:
            out.append((s, e))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Points of `a` not in `b`."""
    out = []
    for s, e in union(a):
        cur = s
        for bs, be in union(b):
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def overlap_summary(comm: dict[str, list[Interval]], compute: list[Interval]) -> dict:
    """Per collective kind and in total: count, time (union of its intervals), the part overlapped
    with compute, and the exposed part (communication while nothing computes)."""
    kinds = {}
    for kind, ivs in sorted(comm.items()):
        total = length(ivs)
        hidden = length(intersection(ivs, compute))
        kinds[kind] = {"count": len(ivs), "time_s": total, "overlapped_s": hidden, "exposed_s": total - hidden}
    everything = [iv for ivs in comm.values() for iv in ivs]
    total = length(everything)
    hidden = length(intersection(everything, compute))
    return {"kinds": kinds, "time_s": total, "overlapped_s": hidden, "exposed_s": total - hidden,
            "compute_s": length(compute)}
