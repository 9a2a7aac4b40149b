"""A short terminal table of runs (what `make bench` prints). The full report is `bench report`."""
from __future__ import annotations

from ddlbench.metrics.throughput import scaling_efficiency, scaling_kind
from ddlbench.record.results import find_results, load_result, unreadable


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _num(x, fmt) -> str:
    return "-" if x is None else format(x, fmt)


def rows(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        tp = r.get("throughput") or {}
        timing = (r.get("timing") or {}).get("step_time_s") or {}
        mem = (r.get("memory") or {}).get("per_rank") or []
        peaks = [m.get("peak_allocated_bytes") or m.get("peak_rss_bytes") for m in mem]
        out.append({
            "run_id": r["run_id"], "status": r["status"],
            "framework": r["framework"]["name"] + ("" if r["framework"].get("variant") in (None, "default")
                                                   else f":{r['framework']['variant']}"),
            "model": r["model"]["name"], "ranks": (r.get("parallel") or {}).get("world_size"),
            "global_batch": (r.get("parallel") or {}).get("global_batch"),
            "samples_per_s": tp.get("samples_per_s"), "tokens_per_s": tp.get("tokens_per_s"),
            "step_time_median_s": timing.get("median"),
            "peak_memory_bytes": max((p for p in peaks if p is not None), default=None),
            "mfu": r.get("mfu"),
            "error": (r.get("error") or {}).get("message"),
        })
    _add_scaling(out)
    return out


def _add_scaling(out: list[dict]) -> None:
    """Scaling efficiency against the smallest world size of the same framework and model."""
    groups: dict[tuple, list[dict]] = {}
    for row in out:
        if row["status"] == "ok":
            groups.setdefault((row["framework"], row["model"]), []).append(row)
    for row in out:
        row["scaling_efficiency"], row["scaling_kind"] = None, None
    for members in groups.values():
        kind = scaling_kind({m["ranks"]: m["global_batch"] for m in members})
        if len({m["ranks"] for m in members}) < 2 or kind == "mixed":
            continue
        base = min(members, key=lambda m: m["ranks"])
        for m in members:
            m["scaling_efficiency"] = scaling_efficiency(m["samples_per_s"], m["ranks"],
                                                         base["samples_per_s"], base["ranks"])
            m["scaling_kind"] = kind


def text_table(headers: list[str], lines: list[list[str]]) -> str:
    """Left-aligned columns under a dashed rule."""
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])


def render(table_rows: list[dict]) -> str:
    headers = ["framework", "model", "ranks", "status", "samples/s", "tokens/s", "step (ms)",
               "peak mem", "MFU", "scaling"]
    lines = []
    for r in table_rows:
        scaling = "-" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.2f} ({r['scaling_kind']})"
        lines.append([r["framework"], r["model"], str(r["ranks"]), r["status"],
                      _num(r["samples_per_s"], ".1f"), _num(r["tokens_per_s"], ".0f"),
                      _num(None if r["step_time_median_s"] is None else r["step_time_median_s"] * 1e3, ".1f"),
                      _fmt_bytes(r["peak_memory_bytes"]),
                      "-" if r["mfu"] is None else f"{r['mfu']:.1%}", scaling])
    out = [text_table(headers, lines)]
    for r in table_rows:
        if r["status"] != "ok":
            out.append(f"  {r['run_id']}: {r['status']}: {r['error']}")
    return "\n".join(out)


def table_for(paths: list[str]) -> str:
    """The table of every result under `paths`; a result file that cannot be read is a row of its
    own (status failed, the file and the problem as its error) and a warning, never the end."""
    from ddlbench.record.readers import DamagedFile, warn_damaged
    records, damaged = [], []
    for p in find_results(paths):
        try:
            records.append(load_result(p))
        except (DamagedFile, OSError) as exc:
            records.append(unreadable(p, exc))
            damaged.append(str(exc))
    warn_damaged(damaged)
    if not records:
        return "no result.json found under: " + " ".join(paths)
    records.sort(key=lambda r: (r["framework"]["name"], r["model"]["name"],
                                (r.get("parallel") or {}).get("world_size") or 0))
    return render(rows(records))
