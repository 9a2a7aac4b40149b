"""`bench report DIR...`: summary.csv, report.md, a self-contained report.html and PNG plots.

Result files are the source of truth; everything here is a view of them (docs/design.md §6).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddlbench.record.results import find_results
from ddlbench.report import plots
from ddlbench.report.frame import SUMMARY_COLUMNS, summary_frame
from ddlbench.report.load import load_advice, load_commbench, load_records, missing_cells, paused_gc
from ddlbench.report.tables import cells, failures, parity


@dataclass
class Report:
    out: Path
    summary: pd.DataFrame
    cells: pd.DataFrame
    parity: pd.DataFrame
    failures: pd.DataFrame
    plots: dict = field(default_factory=dict)      # name -> Path
    records: dict = field(default_factory=dict)    # run directory -> record
    commbench: list = field(default_factory=list)  # commbench.json records found under the paths
    advice: list = field(default_factory=list)     # advice.json (bench advise) found under the paths


def build(paths: list[str], out: Path, progress: bool = True, found=None) -> Report:
    """`found`: (result files, missing cells) of `paths` when the caller has already walked them."""
    files, missing = found if found is not None else (find_results(paths), missing_cells(paths))
    if not files and not missing:
        raise FileNotFoundError("no result.json found under: " + " ".join(paths))
    with paused_gc():
        records = load_records(files, progress) + [r for _, r in missing]
        dirs = [str(f.parent) for f in files] + [str(d) for d, _ in missing]
        df = summary_frame(records, dirs)
        rep = Report(out=out, summary=df, cells=cells(df), parity=parity(df), failures=failures(df),
                     records=dict(zip(dirs, records)))
    rep.commbench = load_commbench(paths)
    rep.advice = load_advice(paths)
    out.mkdir(parents=True, exist_ok=True)
    ordered = SUMMARY_COLUMNS + [c for c in df.columns if c not in SUMMARY_COLUMNS]
    csv_safe(df[ordered]).to_csv(out / "summary.csv", index=False)
    rep.plots = plots.draw_all(rep.cells, plots.convergence_jobs(df, rep.records, out), out)
    from ddlbench.report.sections import write_html, write_markdown
    write_markdown(rep)
    write_html(rep)
    return rep


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells a spreadsheet would run as a formula (a run id, a label or an error message that
    starts with = + - @, a tab or a carriage return) get a leading apostrophe (OWASP's advice for
    CSV); numbers, negative ones too, are left as they are."""
    def safe(v):
        if isinstance(v, str) and v.startswith(FORMULA_STARTS):
            try:
                float(v)
                return v
            except ValueError:
                return "'" + v
        return v
    text = pd.api.types.is_object_dtype, pd.api.types.is_string_dtype
    return df.apply(lambda col: col.map(safe) if any(t(col) for t in text) else col)
