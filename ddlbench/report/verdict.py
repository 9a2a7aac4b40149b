"""The report's first lines: who is fastest, who needs the least memory, who reaches the target
first, per model and world size (and precision), with how sure the reader can be, and what makes
the comparison unfair or incomplete. Pure: the report's tables in, sentences out."""
from __future__ import annotations

import pandas as pd

from ddlbench.report.fmt import human_bytes as _bytes
from ddlbench.report.fmt import missing


def _spread(row) -> tuple[float, float] | None:
    """The interval (95% CI) or the range of the repeats behind a median; None from one run."""
    if not missing(row.get("samples_per_s_ci_low")):
        return row["samples_per_s_ci_low"], row["samples_per_s_ci_high"]
    rng = row.get("samples_per_s_range")
    if not missing(rng) and rng[2] >= 2:
        return rng[0], rng[1]
    return None


def _certainty(best, second) -> str:
    """How sure the lead is: separated intervals, overlapping ones, or single runs."""
    a, b = _spread(best), _spread(second)
    if a is None and b is None:
        return "one run each, no repeats: rerun with run.repeats>=5 to know if it holds"
    if a is None or b is None:
        return f"{'the first' if a is None else 'the second'} ran once: too few repeats to tell (run.repeats>=5)"
    return "their repeats do not overlap" if a[0] > b[1] else "within the spread of their repeats: not a clear lead"


def _settings_line(g: pd.DataFrame) -> str | None:
    """One framework run ok in several configurations (other settings: micro-batch, compile, a
    hook): those are the comparison. None where there is one configuration."""
    runs = g[g["ok"] > 0].dropna(subset=["samples_per_s"]).sort_values("samples_per_s", ascending=False)
    if len(runs) < 2:
        return None
    best, second = runs.iloc[0], runs.iloc[1]

    def named(row) -> str:
        settings = row.get("settings")
        return f"{row['label']} ({settings})" if isinstance(settings, str) and settings else row["label"]
    return (f"fastest setting: {named(best)} {best['samples_per_s']:.1f} samples/s, "
            f"{best['samples_per_s'] / second['samples_per_s']:.2f}x {named(second)} ({_certainty(best, second)})")


def group_lines(g: pd.DataFrame) -> list[str]:
    """Sentences for one (model, world size, precision) group of configurations."""
    # one row per framework label (a label run in several configurations, e.g. other step counts: its best)
    ok = (g[g["ok"] > 0].dropna(subset=["samples_per_s"]).sort_values("samples_per_s", ascending=False)
          .drop_duplicates("label"))
    lines = []
    if len(ok) >= 2:
        best, second = ok.iloc[0], ok.iloc[1]
        lines.append(f"fastest: {best['label']} {best['samples_per_s']:.1f} samples/s, "
                     f"{best['samples_per_s'] / second['samples_per_s']:.2f}x {second['label']} "
                     f"({_certainty(best, second)})")
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
