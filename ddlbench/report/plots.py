"""PNG plots of a report (matplotlib, Agg backend: no display needed). One function per plot;
each returns the file it wrote, or None when the data for it is absent."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

MAX_BARS = 60     # larger reports plot the first 60 configurations and say so in the title
MAX_CURVES = 24   # convergence figures: the first 24 runs of a model/dataset
GiB = 1024 ** 3


def draw_all(cells: pd.DataFrame, conv_jobs: list[tuple], out: Path) -> dict[str, Path]:
    """Every plot, drawn by two worker processes (forked: inputs are not re-imported); a
    10k-run report spends most of its time rendering PNGs."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [("throughput", throughput, (cells, out)), ("scaling", scaling, (cells, out)),
            ("memory", memory, (cells, out)), ("communication", communication, (cells, out)),
            ("mfu", mfu, (cells, out)), ("best", best_heatmap, (cells, out)), ("context", context, (cells, out))]
    jobs += [(name, convergence, args) for name, *args in conv_jobs]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [(name, pool.submit(fn, *args)) for name, fn, args in jobs]
        done = [(name, f.result()) for name, f in futures]
    return {name: path for name, path in done if path is not None}


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")   # legends placed outside the axes stay in the file
    plt.close(fig)
    return path


def _legend_beside(ax, **kw) -> None:
    """The legend to the right of the axes, never over the data (`bbox_inches="tight"` keeps it
    in the saved file)."""
    ax.legend(fontsize=kw.pop("fontsize", 8), loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kw)


def _cell_names(cells: pd.DataFrame) -> list[str]:
    many_models = cells["model"].nunique() > 1
    return [f"{r.label} n={r.world_size}" + (f" ({r.model})" if many_models else "") for r in cells.itertuples()]


def _per_model_axes(models: list, width: float, height: float = 4.0):
    fig, axes = plt.subplots(1, len(models), figsize=(width * len(models), height), squeeze=False)
    return fig, axes[0]


def _series(m: pd.DataFrame) -> pd.DataFrame:
    """Bars per framework label, split by precision where one model ran in several (a bf16 and
    an fp32 run of one framework are two bars, not one picked at random)."""
    precisions = m["precision"].dropna().unique() if "precision" in m else []
    series = m["label"].astype(str)
    if len(precisions) > 1:
        series = series + " " + m["precision"].fillna("?").astype(str)
    return m.assign(series=series)


def _colors(n: int) -> list:
    """n distinct colours (tab10 repeats after 10: two frameworks would share a colour)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def throughput(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    c = cells.dropna(subset=["samples_per_s"])
    if c.empty:
        return None
    models = sorted(c["model"].unique())
    fig, axes = _per_model_axes(models, 6.5)
    for ax, model in zip(axes, models):
        m = _series(c[c["model"] == model])
        sizes, labels = sorted(m["world_size"].unique()), sorted(m["series"].unique())
        width = 0.8 / len(labels)
        colors = _colors(len(labels))
        for j, lab in enumerate(labels):
            sub = m[m["series"] == lab].groupby("world_size").first()
            xs = [sizes.index(n) + j * width for n in sub.index]
            err = np.array([(sub["samples_per_s"] - sub["samples_per_s_ci_low"]).fillna(0),
                            (sub["samples_per_s_ci_high"] - sub["samples_per_s"]).fillna(0)])
            ax.bar(xs, sub["samples_per_s"], width, yerr=err if err.any() else None, capsize=3, label=lab,
                   color=colors[j])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sizes))], [f"{n} rank(s)" for n in sizes])
        ax.set_ylabel("samples/s (median of repeats)")
        ax.set_title(model)
        _legend_beside(ax)
    fig.suptitle("Throughput by framework and world size (error bars: 95% bootstrap CI, 5+ repeats)")
    return _save(fig, out / "throughput.png")


def scaling(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    c = cells.dropna(subset=["scaling_efficiency"])
    if c.empty:
        return None
    models = sorted(c["model"].unique())
    fig, axes = _per_model_axes(models, 5.5)
    for ax, model in zip(axes, models):
        for (lab, kind), g in c[c["model"] == model].groupby(["label", "scaling_kind"]):
            g = g.sort_values("world_size")
            ax.plot(g["world_size"], g["scaling_efficiency"], marker="o", label=f"{lab} ({kind})")
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel("scaling efficiency")
        ax.set_title(model)
        _legend_beside(ax)
    fig.suptitle("Scaling efficiency (X_N/N)/(X_N0/N0); weak or strong in the legend")
    return _save(fig, out / "scaling.png")


def context(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    """tokens/s and peak memory per rank against model.seq_len, per model, for each configuration
    (label, world size, precision) run at two or more lengths; a length that ran out of memory
    is an x on the length axis."""
    if "seq_len" not in cells or cells["seq_len"].dropna().empty:
        return None
    c = cells.dropna(subset=["seq_len"])
    keys = ["model", "label", "world_size", "precision"]
    groups = [(k, g) for k, g in c.groupby(keys, dropna=False) if g["seq_len"].nunique() > 1]
    if not groups:
        return None
    models = sorted({k[0] for k, _ in groups})
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 7), squeeze=False)
    colors = _colors(len(groups))
    for i, ((model, label, world, precision), g) in enumerate(groups):
        col = models.index(model)
        g = g.sort_values("seq_len")
        ok = g[g["ok"] > 0]
        name = f"{label} n={world}" + (f" {precision}" if isinstance(precision, str) else "")
        axes[0][col].plot(ok["seq_len"], ok["tokens_per_s"], "o-", color=colors[i], label=name)
        # tensors' peak where the memory tracker ran (a CPU's RSS counts the runtime too)
        mem = ok["tracker_peak_bytes"].fillna(ok["peak_memory_bytes"]) if "tracker_peak_bytes" in ok else ok["peak_memory_bytes"]
        axes[1][col].plot(ok["seq_len"], mem / GiB, "o-", color=colors[i], label=name)
        oom = g[(g["ok"] == 0) & (g["oom"] > 0)]
        for ax in (axes[0][col], axes[1][col]):
            ax.plot(oom["seq_len"], [0] * len(oom), "x", color=colors[i], ms=10, mew=2)
    for col, model in enumerate(models):
        for row, ylabel in ((0, "tokens/s (median of repeats)"), (1, "peak memory per rank (GiB; tracker's where run)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (model.seq_len)")
            ax.set_ylabel(ylabel)
            _legend_beside(ax)
        axes[0][col].set_title(model)
    fig.suptitle("Throughput and memory against sequence length (x: out of memory)")
    return _save(fig, out / "context.png")


def convergence_jobs(df: pd.DataFrame, records: dict, out: Path) -> list[tuple]:
    """One figure per (model, dataset): (name, curves, title, path) with just the evaluation
    series, so the drawing can happen in a worker process."""
    ok = df[df["status"] == "ok"]
    jobs = []
    for (model, data), group in ok.groupby(["model", "data"], sort=True):
        curves = [(r.label, r.world_size, r.repeat, records[r.path]["convergence"]) for r in group.itertuples()
                  if (records[r.path].get("convergence") or {}).get("eval")]
        if curves:
            name = f"convergence_{model}_{data}"
            jobs.append((name, len(curves), curves[:MAX_CURVES], f"{model} on {data}", out / f"{name}.png"))
    return jobs


def convergence(n_runs: int, curves: list, title: str, path: Path) -> Path:
    """Validation loss/accuracy vs epoch and vs training time, floor and target drawn."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for label, world, repeat, conv in curves:
        ev = conv["eval"]
        for row, metric in enumerate(("loss", "accuracy")):
            for col, x in enumerate(("epoch", "time_s")):
                axes[row][col].plot([e[x] for e in ev], [e[metric] for e in ev], marker=".", lw=1.2,
                                    label=f"{label} n={world}" + (f" r{repeat}" if repeat else ""))
    conv = curves[0][3]
    floor = conv.get("floor") or {}
    for col in range(2):
        for row, metric in enumerate(("loss", "accuracy")):
            ax = axes[row][col]
            if floor.get(metric) is not None:
                ax.axhline(floor[metric], color="black", ls="--", lw=1, label="dataset floor")
            if conv.get("target") is not None and conv.get("target_metric") == metric:
                ax.axhline(conv["target"], color="red", ls=":", lw=1, label="target")
            ax.set_ylabel(f"validation {metric}")
            ax.set_xlabel("epoch" if col == 0 else "training time (s, evaluation excluded)")
    _legend_beside(axes[0][1], fontsize=7, ncol=1 if len(curves) <= 12 else 2)
    more = f" (first {len(curves)} of {n_runs} runs)" if n_runs > len(curves) else ""
    fig.suptitle(f"Statistical efficiency, {title}: validation metric vs epoch and vs time{more}")
    return _save(fig, path)


def _bars(cells: pd.DataFrame, series: dict, ylabel: str, title: str, path: Path, scale=1.0) -> Optional[Path]:
    c = cells.head(MAX_BARS)
    if all(c[k].isna().all() for k in series):
        return None
    x = np.arange(len(c))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(c) * len(series)), 4.2))
    for j, (key, name) in enumerate(series.items()):
        ax.bar(x + j * width, pd.to_numeric(c[key], errors="coerce").fillna(0) / scale, width, label=name)
    ax.set_xticks(x + 0.4 - width / 2, _cell_names(c), rotation=40, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f" (first {MAX_BARS})" if len(cells) > MAX_BARS else ""))
    _legend_beside(ax)
    return _save(fig, path)


def memory(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    return _bars(cells, {"peak_memory_bytes": "measured peak (max over ranks)",
                         "rss_above_baseline_bytes": "CPU: peak RSS above the post-import baseline",
                         "model_state_bytes_theory": "theory: params+grads+optimizer state per rank"},
                 "GiB", "Memory per rank: measured vs theory (CPU: host RSS incl. runtime)",
                 out / "memory.png", scale=GiB)


def communication(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    return _bars(cells, {"comm_bytes_per_step": "payload per step (all kinds)",
                         "comm_wire_bytes_per_rank": "ring wire bytes per rank",
                         "comm_analytic_wire_bytes_per_rank": "analytic wire bytes"},
                 "MiB per step", "Communication volume per step", out / "communication.png", scale=1024 ** 2)


def mfu(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    c = cells.copy()
    c["mfu_pct"] = pd.to_numeric(c["mfu"], errors="coerce") * 100
    return _bars(c, {"mfu_pct": "MFU"}, "% of peak", "Model FLOPs utilisation", out / "mfu.png")


def best_heatmap(cells: pd.DataFrame, out: Path) -> Optional[Path]:
    """The fastest configuration per (model, device count), as the Ultra-Scale Playbook draws it."""
    c = cells.dropna(subset=["samples_per_s"])
    if c.empty:
        return None
    best = c.loc[c.groupby(["model", "world_size"])["samples_per_s"].idxmax()]
    models, sizes = sorted(best["model"].unique()), sorted(best["world_size"].unique())
    mfu_ok = pd.to_numeric(best["mfu"], errors="coerce").notna().all()
    grid = np.full((len(models), len(sizes)), np.nan)
    fig, ax = plt.subplots(figsize=(2.6 * len(sizes) + 2, 0.9 * len(models) + 1.6))
    for r in best.itertuples():
        i, j = models.index(r.model), sizes.index(r.world_size)
        value = float(r.mfu) * 100 if mfu_ok else r.samples_per_s / best[best["model"] == r.model]["samples_per_s"].max()
        grid[i, j] = value
        ax.text(j, i, f"{r.label}\n{r.samples_per_s:.1f} samples/s", ha="center", va="center", fontsize=7)
    im = ax.imshow(grid, cmap="viridis", aspect="auto", alpha=0.75)
    fig.colorbar(im, ax=ax, label="MFU %" if mfu_ok else "samples/s / model's best")
    ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
    ax.set_yticks(range(len(models)), models)
    ax.set_xlabel("devices")
    ax.set_title("Best configuration per model and device count")
    return _save(fig, out / "best.png")
