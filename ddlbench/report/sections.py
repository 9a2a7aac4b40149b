"""The report's sections, defined once, in reading order: each has a title, a note, its table (or
verdict, plots, bullets) and what it says when it has nothing to show. report.md and report.html
are two renderings of the same list; neither names a section of its own.

Every string from a result file is escaped: Jinja2 autoescape in HTML, `md_escape` in Markdown.
report.html is self-contained (plots embedded as data URIs, no network)."""
from __future__ import annotations

import base64
import datetime as _dt
from dataclasses import dataclass, field, replace
from pathlib import Path

import jinja2

from ddlbench.report import render as t
from ddlbench.report.verdict import verdict, verdict_markdown


@dataclass(frozen=True)
class Section:
    key: str                        # the HTML element's id
    title: str
    note: str = ""
    paragraphs: tuple[str, ...] = ()
    table: tuple | None = None      # (head, rows)
    flags: list | None = None       # per row, per cell: shown flagged (parity)
    bad_column: int | None = None   # a column whose values read as failures
    status_column: int | None = None  # a column of statuses: ok in green, the rest in red
    empty: str | None = None        # said when the table has no rows; None: the section is left out
    verdict: list | None = None     # [(heading, sentences)]
    plots: list = field(default_factory=list)   # [(name, path, caption)] after the table
    bullets: tuple = ()             # ((term, text), ...)
    after: str = ""                 # a paragraph after the table

    @property
    def shown(self) -> bool:
        return bool(self.verdict is not None or self.bullets or self.table is None or self.table[1]
                    or self.empty is not None)


HOW_TO_READ = (
    ("samples/s", "global batch / median global step time; a step's global time is the slowest rank's."),
    ("scaling", "(X_N / N) / (X_N0 / N0) against the smallest world size N0 of the same configuration; strong "
                "holds the global batch, weak the per-device batch."),
    ("time to target", "training time (sum of step times, evaluation excluded) until the first evaluation that "
                       "met the target; \"-\" = not reached."),
    ("theory", "parameter + gradient + optimizer-state bytes per rank for the strategy (ZeRO paper accounting); "
               "on CPU the measured value is the process RSS, runtime included."),
    ("-", "a value the run did not produce (a failed run, no 1-rank run to scale against, no target); never "
          "a number made up."),
    ("source", "every number comes from a result.json; summary.csv has one row per run."),
)

COMPARISON_NOTE = ("Median over repeats of one configuration; brackets: 95% percentile-bootstrap interval, shown "
                   "from 5 ok repeats (with 2-4 the row shows their range, labelled as such: so few resampled "
                   "medians span about [min, max], not a 95% interval). MFU: on a GPU on the datasheet peak "
                   "(comparable with published figures; result.json's flops.mfu_on_measured_peak has it on the "
                   "matmul peak measured there), on CPU on the measured matmul probe.")
PARITY_NOTE = ("Configurations of one model at one world size are compared field by field against the most "
               "common value; a difference the user can equalise is flagged (docs/design.md §7: same data, seed, "
               "global batch, optimizer, LR, precision; compile, float8, optim.impl, attention). What each "
               "framework does by design, its recommended recipe (gradient-reduction dtype, who casts what), is "
               "shown, and flagged only where configurations of one framework differ in it (an override).")
GRAD_DTYPE_NOTE = ("The gradient-reduction dtype differs: each framework runs its recommended recipe (DeepSpeed "
                   "reduces in the training dtype, DDP, FSDP2 and Horovod in fp32), so bytes on the wire and "
                   "numerics differ. To compare at equal reduction dtype: framework.options.communication_data_type=fp32 "
                   "(DeepSpeed), or framework.options.reduce_dtype=param (FSDP2) and framework.options.comm_hook=bf16 "
                   "(DDP) for bf16 everywhere.")


PARITY_NOTES = {
    "grad_reduce_dtype": GRAD_DTYPE_NOTE,
    "precision_recipe": ("The precision recipe differs: at bf16/fp16 DDP, Horovod and pipelines run autocast over fp32 "
                         "parameters, FSDP2 its MixedPrecisionPolicy (low-precision parameters while they are "
                         "gathered), DeepSpeed its engine (low-precision parameters and gradients, fp32 master "
                         "weights): the same run.precision, different numerics and memory."),
    "compile": "Compiled and eager runs are compared: set run.compile the same for every run.",
    "float8": ("Runs with float8 matmuls (run.float8) are compared with bf16 ones: a different numeric recipe; "
               "set run.float8 the same for every run."),
    "optimizer_impl": ("The optimizer's implementation differs (fused, foreach, for-loop, or the framework's own): "
                       "the same update, different speed; set optim.impl the same for every run."),
    "gc": ("The garbage collector's policy in the loop differs (run.gc: freeze, python or torchtitan; a full "
           "collection under python costs an FSDP2 step ~0.2 s): set run.gc the same for every run."),
    "attention": ("The attention kernel differs (model.native_config.attn_implementation): set model.attention "
                  "the same for every run."),
}


def steady_window_notes(rep) -> tuple[str, ...]:
    """Runs whose window mean step differs from their median step by more than their own spread
    (result.json timing.window_vs_median): the throughput on the median step beside the window's."""
    df = rep.summary
    if "window_outlier" not in df or not len(df):
        return ()
    flagged = df[df["window_outlier"].map(lambda v: v is True or v == 1.0)]
    if not len(flagged):
        return ()
    runs = "; ".join(f"{r.label} ({r.run_id}): window {r.samples_per_s:.1f}, median step "
                     f"{r.samples_per_s_median_step:.1f} samples/s{_slowest_step(r)}" for r in flagged.itertuples())
    return (f"{len(flagged)} run(s) had outlying steps in their measured window (window mean step and median "
            f"step differ by more than half their p10-p90 range): {runs}.",)


def _slowest_step(r) -> str:
    """How much the run's slowest step alone moved its window's figure, and the window
    (run.min_window_s) in which one such step would move it by under 1% (metrics/window.py)."""
    moves, window_s = getattr(r, "slowest_step_moves", None), getattr(r, "window_s", None)
    if moves is None or window_s is None or moves != moves or window_s != window_s:   # NaN: an older record
        return ""
    from ddlbench.metrics.window import seconds_for_outlier
    need = seconds_for_outlier(moves * window_s)
    return (f", its slowest step alone {100 * moves:.1f}% of the window's figure"
            + (f" (run.min_window_s={need:.0f} keeps one such step under 1%)" if moves >= 0.01 else ""))


def parity_flags(rep) -> int:
    return int(sum(1 for d in rep.parity["differs"] if d)) if len(rep.parity) else 0


def parity_notes(rep) -> list[str]:
    """What a flagged parity field means and the override that equalises it; then what differs by
    each framework's design (shown, not flagged), with how to equalise it if wanted."""
    differs = {f for d in (rep.parity["differs"] if len(rep.parity) else []) for f in d}
    design = {f for d in (rep.parity["by_design"] if len(rep.parity) and "by_design" in rep.parity else []) for f in d}
    out = [note for field, note in PARITY_NOTES.items() if field in differs]
    if design:
        out.append("By design, not flagged: " + ", ".join(sorted(design)) + " differ between frameworks, each "
                   "running its recommended recipe" + ("" if design <= differs else
                                                        ". " + " ".join(PARITY_NOTES[f] for f in sorted(design - differs))))
    return out


def header(rep) -> dict:
    df = rep.summary
    envs = [r.get("env") or {} for r in rep.records.values()]
    return {"title": "ddlbench comparison report",
            "generated": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "n_runs": len(df), "n_ok": int((df["status"] == "ok").sum()), "parity_flags": parity_flags(rep),
            "hosts": sorted({h for e in envs for h in (e.get("hostnames") or [])}),
            "torch": sorted({str(e.get("torch")) for e in envs if e.get("torch")}),
            "devices": sorted({str(e.get("device")) for e in envs if e.get("device")})}


def sections(rep, head: dict) -> list[Section]:
    """The report, top to bottom: the verdict first, the detail after."""
    flags = head["parity_flags"]
    parity = t.parity_table(rep)
    n_runs = len(rep.summary)
    plots = [(name, path, t.CAPTIONS[name.split("_")[0]]) for name, path in rep.plots.items()]
    out = [
        Section("verdict", "Verdict", verdict=verdict(rep.cells, flags, head["devices"])),
        Section("comparison", "Comparison", COMPARISON_NOTE, table=t.cell_table(rep), plots=plots,
                paragraphs=steady_window_notes(rep), empty="No configuration to compare."),
        Section("strategies", "Strategies: taxonomy, communication, time to target", t.STRATEGY_NOTE,
                table=t.strategy_table(rep)),
        Section("parity", "Parity", PARITY_NOTE,
                paragraphs=(f"{flags} configuration(s) differ from the majority." if flags
                            else "All compared configurations agree.", *parity_notes(rep)),
                table=parity[:2], flags=parity[2], empty="No configuration to compare."),
        Section("failures", "Failures", table=t.failure_table(rep), bad_column=4, empty="No failed runs."),
        Section("model-parallel", "Model parallelism: per rank / pipeline stage", t.MODEL_PARALLEL_NOTE,
                table=t.model_parallel_table(rep)),
        Section("projection", "Projection check: predicted vs measured step time", t.PROJECTION_NOTE,
                table=t.projection_check_table(rep)),
        Section("stragglers", "Stragglers", t.STRAGGLER_NOTE, table=t.straggler_table(rep), bad_column=4),
        Section("comm-time", "Communication time: exposed and overlapped", t.COMM_TIME_NOTE,
                table=t.comm_time_table(rep)),
        Section("flops", "FLOPs: MFU, HFU and the peak behind them", t.FLOPS_NOTE, table=t.flops_table(rep)),
        Section("moe", "Mixture of Experts: load balance and all-to-all", t.MOE_NOTE, table=t.moe_table(rep)),
        Section("checkpoints", "Checkpoints: what a save costs", t.CHECKPOINT_NOTE, table=t.checkpoint_table(rep)),
        Section("advice", "Advice: predicted vs measured", t.ADVICE_NOTE, table=t.advice_table(rep)),
        Section("runs", "All runs", table=t.run_table(rep), status_column=1, empty="No runs.",
                after=(f"First {t.MAX_RUN_ROWS} runs shown; summary.csv has every run."
                       if n_runs > t.MAX_RUN_ROWS else "")),
        Section("how-to-read", "How to read this report", bullets=HOW_TO_READ),
    ]
    return [s for s in out if s.shown]


# ---- Markdown ---------------------------------------------------------------------------------

def md_escape(s: str) -> str:
    """CommonMark backslash escapes (no HTML entities: they show as `&gt;` in plain-text readers)."""
    return (str(s).replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").replace(">", "\\>")
            .replace("\n", " "))


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(map(md_escape, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(md_escape, r)) + " |" for r in rows]
    return "\n".join(lines)


def section_markdown(s: Section) -> list[str]:
    parts = [f"## {s.title}", ""]
    for text in (s.note, *s.paragraphs):
        if text:
            parts += [text, ""]
    if s.verdict is not None:
        parts += [*verdict_markdown(s.verdict, md_escape), ""]
    if s.table is not None:
        parts += [md_table(*s.table) if s.table[1] else s.empty or "", ""]
    for name, path, caption in s.plots:
        parts += [f"### {name}", "", f"![{name}]({Path(path).name})", "", caption, ""]
    if s.after:
        parts += [s.after, ""]
    parts += [f"- **{term}**: {text}" for term, text in s.bullets]
    return parts


def write_markdown(rep) -> Path:
    h = header(rep)
    parts = [f"# {h['title']}", "",
             f"Generated {h['generated']} from {h['n_runs']} runs ({h['n_ok']} ok). "
             f"Devices: {', '.join(h['devices']) or '-'}; torch {', '.join(h['torch']) or '-'}; "
             f"hosts: {', '.join(h['hosts']) or '-'}.", ""]
    for s in sections(rep, h):
        parts += section_markdown(s)
    path = rep.out / "report.md"
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path


# ---- HTML -------------------------------------------------------------------------------------

def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def write_html(rep) -> Path:
    env = jinja2.Environment(loader=jinja2.PackageLoader("ddlbench.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    h = header(rep)
    secs = [replace(s, plots=[(n, _data_uri(p), c) for n, p, c in s.plots]) for s in sections(rep, h)]
    html = env.get_template("report.html.j2").render(**h, sections=secs)
    path = rep.out / "report.html"
    path.write_text(html)
    return path
