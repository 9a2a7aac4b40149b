"""The report's first lines: who is fastest, who needs the least memory, who reaches the target
first, per model and world size (and precision), with how sure the reader can be, and what makes
the comparison unfair or incomplete. A framework is called fastest only when it is faster than
every other beyond the run-to-run noise (ddlbench/metrics/compare.py: a rank-sum test over
interleaved repeats, with the ratio's interval); otherwise the line says which are
indistinguishable and how many repeats would separate them. Pure: the report's tables in,
sentences out."""
from __future__ import annotations

import pandas as pd

from ddlbench.metrics.compare import compare
from ddlbench.report.fmt import human_bytes as _bytes
from ddlbench.report.fmt import missing


def runs_of(row) -> list[float]:
    """The throughput of each ok run behind a configuration's row (one figure where the row does
    not list them)."""
    runs = row.get("samples_per_s_runs")
    if isinstance(runs, (list, tuple)) and len(runs):
        return [float(x) for x in runs]
    return [] if missing(row.get("samples_per_s")) else [float(row["samples_per_s"])]


def _blocked(a, b) -> bool:
    """Whether two configurations' runs ran in blocks (all of one before all of the other), by
    their windows' start times: then a machine that drifted reads as a difference."""
    ta, tb = a.get("began_runs"), b.get("began_runs")
    if not isinstance(ta, (list, tuple)) or not isinstance(tb, (list, tuple)) or len(ta) < 2 or len(tb) < 2:
        return False
    ta, tb = [t for t in ta if not missing(t)], [t for t in tb if not missing(t)]
    return bool(ta and tb) and (max(ta) < min(tb) or max(tb) < min(ta))


def _ranked(rows: pd.DataFrame, named) -> str:
    """The fastest of `rows` (sorted, fastest first) against the others, by the rule of
    ddlbench/metrics/compare.py: a winner only when it is faster than every other beyond the
    run-to-run noise; otherwise which are indistinguishable, and what would separate them."""
    top = rows.iloc[0]
    pairs = [(r, compare(runs_of(top), runs_of(r))) for _, r in rows.iloc[1:].iterrows()]
    second, first_pair = pairs[0]
    lead = (f"{named(top)} {top['samples_per_s']:.1f} samples/s, "
            f"{top['samples_per_s'] / second['samples_per_s']:.2f}x {named(second)}")
    blocked = [named(r) for r, _ in pairs if _blocked(top, r)]
    note = (f"; runs in blocks, not interleaved ({named(top)} against {', '.join(blocked)}): a drifting machine "
            "reads as a difference" if blocked else "")
    if all(c.decided and c.ratio > 1 for _, c in pairs):
        return f"fastest: {lead} ({first_pair.why()}){note}"
    tied = [named(top)] + [named(r) for r, c in pairs if not (c.decided and c.ratio > 1)]
    slower = [named(r) for r, c in pairs if c.decided and c.ratio > 1]
    out = (f"no clear winner: {', '.join(tied)} not told apart from the run-to-run noise (by the median: "
           f"{lead}; {first_pair.why()})")
    if slower:
        out += f"; slower beyond the noise: {', '.join(slower)}"
    return out + note


def _settings_line(g: pd.DataFrame) -> str | None:
    """One framework run ok in several configurations (other settings: micro-batch, compile, a
    hook): those are the comparison. None where there is one configuration."""
    runs = g[g["ok"] > 0].dropna(subset=["samples_per_s"]).sort_values("samples_per_s", ascending=False)
    if len(runs) < 2:
        return None

    def named(row) -> str:
        settings = row.get("settings")
        return f"{row['label']} ({settings})" if isinstance(settings, str) and settings else row["label"]
    line = _ranked(runs, named)
    return line.replace("fastest: ", "fastest setting: ", 1).replace("no clear winner: ", "no clear winner among settings: ", 1)


def group_lines(g: pd.DataFrame) -> list[str]:
    """Sentences for one (model, world size, precision) group of configurations."""
    # one row per framework label (a label run in several configurations, e.g. other step counts: its best)
    ok = (g[g["ok"] > 0].dropna(subset=["samples_per_s"]).sort_values("samples_per_s", ascending=False)
          .drop_duplicates("label"))
    lines = []
    if len(ok) >= 2:
        lines.append(_ranked(ok, lambda row: row["label"]))
    elif len(ok) == 1:
        lines.append(_settings_line(g) or
                     f"only {ok.iloc[0]['label']} ran ok ({ok.iloc[0]['samples_per_s']:.1f} samples/s): nothing to compare")
    mem = g[g["ok"] > 0].dropna(subset=["peak_memory_bytes"]).sort_values("peak_memory_bytes").drop_duplicates("label")
    if len(mem) >= 2:
        low, high = mem.iloc[0], mem.iloc[-1]
        lines.append(f"least memory: {low['label']} {_bytes(low['peak_memory_bytes'])} per rank "
                     f"({high['label']}: {_bytes(high['peak_memory_bytes'])})")
    ttt = g[g["ok"] > 0].dropna(subset=["time_to_target_s"]).sort_values("time_to_target_s").drop_duplicates("label")
    if len(ttt) >= 1:
        first = ttt.iloc[0]
        lines.append(f"first to the target: {first['label']} in {first['time_to_target_s']:.2f} s"
                     + (f" ({len(ttt)} of {len(ok)} reached it)" if len(ttt) < len(ok) else ""))
    bad = g[g["ok"] < g["runs"]]
    if len(bad):
        lines.append("not ok: " + ", ".join(f"{r['label']} ({r['runs'] - r['ok']} of {r['runs']})"
                                            for _, r in bad.iterrows()))
    return lines


def _against_default(g: pd.DataFrame, cells: pd.DataFrame, key: tuple) -> list[str]:
    """For a group run with a recipe setting (compiled, float8): its fastest against the fastest of
    the same model, ranks and precision without it."""
    same = (cells["model"] == key[0]) & (cells["world_size"] == key[1]) & (cells["recipe"] == "")
    if len(key) > 3:
        same &= cells["precision"] == key[2]
    base = cells[same & (cells["ok"] > 0)].dropna(subset=["samples_per_s"])
    mine = g[g["ok"] > 0].dropna(subset=["samples_per_s"])
    if base.empty or mine.empty:
        return []
    a, b = mine.loc[mine["samples_per_s"].idxmax()], base.loc[base["samples_per_s"].idxmax()]
    return [f"{a['label']} {a['samples_per_s']:.1f} samples/s, {a['samples_per_s'] / b['samples_per_s']:.2f}x "
            f"the fastest run without "
            f"{a['recipe']} ({b['label']} {b['samples_per_s']:.1f} samples/s)"]


def verdict(cells: pd.DataFrame, parity_flags: int, devices: list[str]) -> list[tuple[str, list[str]]]:
    """[(heading, sentences)] per group, then caveats that apply to the whole report. Groups: model,
    world size, precision and recipe (run.compile / run.float8: a compiled run is not ranked
    against eager ones, it is set beside the fastest of them)."""
    out = []
    if len(cells):
        if "recipe" not in cells:
            cells = cells.assign(recipe="")
        keys = ["model", "world_size"] + (["precision"] if "precision" in cells else []) + ["recipe"]
        for key, g in cells.groupby(keys, sort=True, dropna=False):
            model, world, recipe = key[0], key[1], key[-1]
            prec = key[2] if len(key) > 3 and isinstance(key[2], str) else None
            ranks = "? ranks" if missing(world) else f"{world:.0f} rank{'s' if world != 1 else ''}"
            heading = f"{model}, {ranks}" + (f", {prec}" if prec else "") + (f", {recipe}" if recipe else "")
            lines = group_lines(g)
            beside = _against_default(g, cells, key) if recipe else []
            if beside:   # set beside the eager runs: one such run has something to be compared with
                lines = [ln for ln in lines if not ln.startswith("only ")] + beside
            if lines:
                out.append((heading, lines))
    caveats = []
    if parity_flags:
        caveats.append(f"{parity_flags} configuration(s) differ from the others in a setting that changes the "
                       "comparison (see Parity): read their rows with that in mind")
    if devices and all(d.startswith("cpu") for d in devices):
        caveats.append("ran on CPUs with gloo: compute and communication balance differ from GPUs with NCCL; "
                       "rank the frameworks on the target machine before deciding")
    if caveats:
        out.append(("caveats", caveats))
    return out


def verdict_markdown(sections: list[tuple[str, list[str]]], escape=str) -> list[str]:
    """Markdown bullets; `escape` makes names from result.json safe to embed (sections.md_escape)."""
    if not sections:
        return ["No configuration ran ok: see Failures."]
    return [f"- **{escape(h)}**: " + escape("; ".join(lines)) for h, lines in sections]
