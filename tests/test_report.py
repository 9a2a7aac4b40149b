"""`bench report` on result files with known numbers: arithmetic, parity, failures, escaping."""
import csv
import json
import math

import pytest
from conftest import bench
from reportdata import make_record, write

from ddlbench import report
from ddlbench.report.frame import SUMMARY_COLUMNS


@pytest.fixture
def known(tmp_path):
    root = tmp_path / "runs"
    for i, sps in enumerate((90.0, 100.0, 110.0)):             # ddp n=1: three repeats
        write(root, make_record(f"ddp1_r{i}", repeat=i, sps=sps, ttt=10.0 + i))
    write(root, make_record("ddp2", world=2, sps=150.0, ttt=8.0))           # strong: same global batch
    write(root, make_record("fsdp1", framework="fsdp2", variant="full", sps=100.0))
    write(root, make_record("fsdp2", framework="fsdp2", variant="full", world=2, global_batch=16, sps=180.0))  # weak
    write(root, make_record("ds2", framework="deepspeed", variant="zero2", world=2, sps=140.0, lr=0.01))
    write(root, make_record("hvd2", framework="horovod", world=2, status="failed", message="rank 1 raised at step 2"))
    (root / "corrupt").mkdir()
    (root / "corrupt" / "result.json").write_text('{"schema": "ddlbench.res')   # torn file
    return root


def test_summary_csv_numbers(known, tmp_path):
    rep = report.build([str(known)], tmp_path / "out", progress=False)
    with open(tmp_path / "out" / "summary.csv") as f:
        rows = {r["run_id"]: r for r in csv.DictReader(f)}
    assert list(rows["ddp2"])[:len(SUMMARY_COLUMNS)] == SUMMARY_COLUMNS
    # strong: (150/2) / (median(90,100,110)/1) = 0.75
    assert float(rows["ddp2"]["scaling_efficiency"]) == pytest.approx(0.75)
    assert rows["ddp2"]["scaling_kind"] == "strong"
    # weak: global batch 8 -> 16 with 1 -> 2 ranks: (180/2)/(100/1) = 0.9
    assert float(rows["fsdp2"]["scaling_efficiency"]) == pytest.approx(0.9)
    assert rows["fsdp2"]["scaling_kind"] == "weak"
    assert float(rows["ddp1_r0"]["peak_memory_bytes"]) == 1000 and float(rows["ddp2"]["peak_memory_bytes"]) == 1001
    assert rows["hvd2"]["status"] == "failed" and rows["corrupt"]["status"] == "failed"
    cell = rep.cells[(rep.cells["label"] == "ddp") & (rep.cells["world_size"] == 1)].iloc[0]
    assert (cell["runs"], cell["ok"], cell["samples_per_s"]) == (3, 3, 100.0)
    # 3 repeats: no 95% interval is claimed; the range of the repeats is kept instead
    assert math.isnan(cell["samples_per_s_ci_low"]) and cell["samples_per_s_range"] == (90.0, 110.0, 3)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| ddp | gpt2_tiny | 1 | fp32 | 3/3 | 100.0 (range 90.0-110.0, n=3) |" in md
    assert "nan" not in md   # a configuration whose every run failed has no MFU, scaling or taxonomy: "-"
    assert md.index("## Verdict") < md.index("## Comparison") and "- **gpt2_tiny, 1 rank, fp32**:" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.index("<h2>Verdict</h2>") < html.index("<h2>Comparison</h2>")
    assert cell["time_to_target_s"] == 11.0


def test_parity_flags_the_run_that_differs(known, tmp_path):
    rep = report.build([str(known)], tmp_path / "out", progress=False)
    flagged = {r.run_id: r.differs for r in rep.parity.itertuples() if r.differs}
    assert flagged == {"ds2": ["lr"], "fsdp2": ["global_batch"]}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "DIFFERS: lr" in md and "DIFFERS: global_batch" in md


def test_failures_table_lists_failed_and_unreadable(known, tmp_path):
    rep = report.build([str(known)], tmp_path / "out", progress=False)
    f = rep.failures.set_index("run_id")
    assert f.loc["hvd2", "error_message"] == "rank 1 raised at step 2" and f.loc["hvd2", "error_rank"] == 1
    assert f.loc["corrupt", "error_type"] == "unreadable_result"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "rank 1 raised at step 2" in html and "unreadable_result" in html


def test_a_sweep_where_every_run_failed_gets_a_report_of_its_failures(tmp_path):
    """Issue 66 (7): no ok run at all (or only a torn result) was a pandas ValueError."""
    root = tmp_path / "runs"
    write(root, make_record("hvd2", framework="horovod", world=2, status="failed", message="rank 1 raised at step 2"))
    (root / "torn").mkdir()
    (root / "torn" / "result.json").write_text('{"schema": "ddlbench.res')
    rep = report.build([str(root)], tmp_path / "out", progress=False)
    assert set(rep.failures["run_id"]) == {"hvd2", "torn"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert "rank 1 raised at step 2" in html and "unreadable_result" in html
    only_torn = tmp_path / "torn_only"
    (only_torn / "t").mkdir(parents=True)
    (only_torn / "t" / "result.json").write_text('{"schema"')
    proc = bench("report", str(only_torn), "-o", str(tmp_path / "out2"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "unreadable_result" in (tmp_path / "out2" / "report.md").read_text()


def test_pipeline_stages_are_listed_per_rank(tmp_path):
    root = tmp_path / "runs"
    rec = make_record("pp2", framework="pipeline", variant="1f1b", world=2)
    rec["parallel"].update(dp=1, pp=2)
    rec["model_parallel"] = {
        "kind": "pipeline", "schedule": "1f1b", "pp": 2, "stages_per_rank": 1, "n_microbatches": 4,
        "bubble_fraction_analytic": 0.2, "idle_fraction_measured_mean": 0.3,
        "per_rank": [{"pp_rank": 0, "stages": [0], "params": 247424, "model_state_bytes_theory": 3958784,
                      "idle_fraction_measured": 0.25},
                     {"pp_rank": 1, "stages": [1], "params": 231296, "model_state_bytes_theory": 3700736,
                      "idle_fraction_measured": 0.35}]}
    write(root, rec)
    write(root, make_record("ddp1"))
    report.build([str(root)], tmp_path / "out", progress=False)
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("## Model parallelism: per rank / pipeline stage")[1].split("## All runs")[0]
    rows = [l for l in section.splitlines() if l.startswith("| pp2 ")]
    assert len(rows) == 2                        # one per rank; the DDP run has none
    assert "| 1 x 1 x 2 | 1f1b | 4 | 0.200 | 0 | 0 | 247,424 | 3.8 MiB | 1000 B | 0.250 |" in rows[0]
    assert "| 1 | 1 | 231,296 | 3.5 MiB | 1001 B | 0.350 |" in rows[1]
    assert "Model parallelism: per rank / pipeline stage" in (tmp_path / "out" / "report.html").read_text()


def test_a_sweeps_cells_without_result_are_listed_as_missing(tmp_path):
    from ddlbench.sweep import manifest
    from ddlbench.sweep.cells import Cell
    sweep = tmp_path / "sweep"
    cells = [Cell(index=i, id=f"cell{i}", overrides=[f"run.seed={i}"], repeat=0) for i in range(3)]
    manifest.create(sweep, cells, {"backend": "local", "jobs": []})
    write(sweep, make_record("cell0"))                        # one ran; two never wrote a result
    rep = report.build([str(sweep)], tmp_path / "out", progress=False)
    assert sorted(rep.summary["run_id"]) == ["cell0", "cell1", "cell2"]
    missing = rep.failures.set_index("run_id")
    assert list(missing.loc[["cell1", "cell2"], "status"]) == ["missing", "missing"]
    assert "expected cell has no result.json" in (tmp_path / "out" / "report.md").read_text()


def test_user_strings_are_escaped(tmp_path):
    root = tmp_path / "runs"
    write(root, make_record("x", framework="<script>alert(1)</script>", sps=10.0))
    write(root, make_record("y", world=1, status="failed", message="a|b <img src=x onerror=alert(2)>"))
    report.build([str(root)], tmp_path / "out", progress=False)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html
    md = (tmp_path / "out" / "report.md").read_text()
    assert "a\\|b \\<img" in md and "<script>" not in md and "&lt;" not in md and "&gt;" not in md


def test_summary_csv_cells_never_start_a_formula(tmp_path):
    """Issue 66: a user string starting with = + - @ was a raw summary.csv cell, which a spreadsheet
    runs as a formula; such a cell is written with a leading apostrophe (OWASP's CSV advice), and
    numbers, negative ones too, stay numbers."""
    root = tmp_path / "runs"
    write(root, make_record("=HYPERLINK(\"http://x\")", sps=10.0))
    write(root, make_record("y", world=1, status="failed", message="@SUM(1+1)*cmd|' /C calc'!A0"))
    report.build([str(root)], tmp_path / "out", progress=False)
    with open(tmp_path / "out" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    cells = [v for r in rows for v in r.values() if v]
    assert not [v for v in cells if v[0] in "=+@\t\r" or (v[0] == "-" and not _number(v))], cells
    assert "'=HYPERLINK(\"http://x\")" in {r["run_id"] for r in rows}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_wandb_report_offline_writes_a_valid_spec(known, tmp_path):
    from ddlbench.report.wandb_report import build_report, publish

    rep = report.build([str(known)], tmp_path / "out", progress=False)
    message = publish(rep)
    assert "offline" in message and "no network" in message
    spec = json.loads((tmp_path / "out" / "wandb_report.json").read_text())
    assert "ddp1_r0" in spec["runset"]["run_names"] and not spec["online"]
    wr = build_report(spec, offline=True)   # the wandb-workspaces objects build from the spec without network
    grid = wr.blocks[-1]
    assert len(grid.panels) == len(spec["panels"])
    # what W&B receives: runs selected by name with an IN filter (a search query is sent as a
    # literal substring, not a regex), no search text
    # (serialised without an entity: with one, wandb-workspaces looks the project up online)
    import dataclasses
    model = dataclasses.replace(grid.runsets[0], entity="")._to_model().model_dump(by_alias=True, mode="json")
    assert model["search"]["query"] == ""
    assert model["filters"]["filters"] == [{"key": {"section": "run", "name": "displayName"}, "op": "IN",
                                            "value": spec["runset"]["run_names"], "disabled": False}]
    metrics = {m for p in spec["panels"] for m in p.get("y", p.get("metrics", []))}
    assert {"val/loss", "throughput/samples_per_s", "memory/model_state_theory(bytes)", "comm/wire_bytes_per_rank",
            "comm/exposed_s"} <= metrics
    assert any(t.startswith("### Comparison") and "scaling" in t for t in spec["tables_markdown"])
    assert any(t.startswith("### Parity") for t in spec["tables_markdown"])


def test_wandb_report_keeps_the_default_entity(known, tmp_path, monkeypatch):
    """entity: null must leave the library's default (the logged-in user's), not send ''."""
    from types import SimpleNamespace

    import wandb_workspaces.reports.v2.interface as wri

    from ddlbench.report.wandb_report import build_report, spec_for
    monkeypatch.setattr(wri, "_get_api", lambda: SimpleNamespace(default_entity="me"))
    spec = spec_for(report.build([str(known)], tmp_path / "out", progress=False))
    assert spec["entity"] is None
    wr = build_report(spec)
    assert wr.entity == "me" and wr.blocks[-1].runsets[0].entity == ""   # a runset with no entity: the report's
    assert build_report({**spec, "entity": "team"}).entity == "team"


def test_cli_report_and_bad_paths(known, tmp_path):
    proc = bench("report", str(known), "-o", str(tmp_path / "cli"))
    assert proc.returncode == 0, proc.stderr
    assert "9 runs (2 not ok)" in proc.stdout and (tmp_path / "cli" / "report.html").exists()
    proc = bench("report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "no such path" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = bench("report", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "no result.json" in proc.stderr


def test_comm_time_is_shown_beside_the_commbench_ceiling(tmp_path):
    root = tmp_path / "runs"
    rec = make_record("ddp2", world=2)
    rec["env"]["backend"] = "gloo"
    rec["comm"] = {"time": {"kinds": {"all_reduce": {"count": 1.0, "time_s": 0.004, "overlapped_s": 0.001,
                                                     "exposed_s": 0.003, "busbw_Bps": 5e8,
                                                     "time_s_spread": [0.0025, 0.0035, 0.006]}}}}
    write(root, rec)
    (root / "cb").mkdir()
    (root / "cb" / "commbench.json").write_text(json.dumps({
        "backend": "gloo", "world_size": 2, "rows": [{"kind": "all_reduce", "busbw_Bps": 6e8},
                                                     {"kind": "all_reduce", "busbw_Bps": 7e8}]}))
    report.build([str(root)], tmp_path / "out", progress=False)
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("## Communication time: exposed and overlapped")[1].split("## All runs")[0]
    # 4 ms a step (its profiled periods 2.5 to 6 ms), 3 ms exposed, 25% overlapped, 0.5 GB/s against the
    # best commbench row, 0.7
    assert "| ddp2 | ddp:default | 2 | all_reduce | 1 | 4.00 | 2.50-6.00 | 3.00 | 25% | 0.500 | 0.700 |" in section
    assert "Communication time: exposed and overlapped" in (tmp_path / "out" / "report.html").read_text()


def test_flops_table_shows_mfu_hfu_method_and_peak(tmp_path):
    root = tmp_path / "runs"
    rec = make_record("ac", world=2)
    rec["mfu"] = 0.10
    rec["flops"] = {"train_per_sample": 3.0e9, "hardware_train_per_sample": 4.0e9, "hfu": 0.1333333,
                    "method": "flop_counter(meta)", "recompute": "activation checkpointing per block",
                    "peak_per_device": 9.894e14, "peak_dtype": "bf16", "peak_source": "conf/hardware gpu_table[H100] bf16"}
    write(root, rec)
    write(root, make_record("plain"))          # a record without a flops section adds no row
    report.build([str(root)], tmp_path / "out", progress=False)
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("## FLOPs: MFU, HFU and the peak behind them")[1].split("## All runs")[0]
    assert ("| ac | ddp:default | fp32 | 10.0% | 13.3% | 3e+09 | 4e+09 | flop_counter(meta) + activation "
            "checkpointing per block | 9.894e+14 | bf16 | conf/hardware gpu_table[H100] bf16 |") in section
    assert "| plain |" not in section
    assert "FLOPs: MFU, HFU and the peak behind them" in (tmp_path / "out" / "report.html").read_text()


def test_an_auto_precision_config_is_one_configuration_per_precision_that_ran():
    """run.precision=auto runs bf16 on a GPU and fp32 on a CPU: the same config, not repeats of
    one configuration (config_id and the scaling group follow the record's precision)."""
    from ddlbench.report.frame import summary_row
    rows = {}
    for name, ran in (("gpu_a", "bf16"), ("gpu_b", "bf16"), ("cpu", "fp32")):
        rec = make_record(name)
        rec["config"]["run"].update(precision="auto", dir="x")
        rec["precision"] = ran
        rows[name] = summary_row(rec)
    assert rows["gpu_a"]["config_id"] == rows["gpu_b"]["config_id"] != rows["cpu"]["config_id"]
    assert rows["gpu_a"]["scaling_group"] != rows["cpu"]["scaling_group"]
    assert rows["cpu"]["precision"] == "fp32"
    # an explicit precision is left as it is
    assert summary_row(make_record("x"))["config_id"] == summary_row(make_record("y"))["config_id"]


def test_throughput_plot_keeps_its_legend_off_the_bars_and_one_colour_per_series(tmp_path, monkeypatch):
    """12 frameworks, two precisions of one: the legend sits beside the axes (it covered the
    bars), every series has its own colour (tab10 repeated after 10), a bf16 and an fp32 run of
    one framework are two bars, and the saved figure holds the title and the legend whole."""
    import matplotlib.colors as mcolors
    import pandas as pd

    from ddlbench.report import plots
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    rows = [{"label": f"fw{i}", "model": "m", "world_size": 1, "precision": "bf16", "samples_per_s": 100.0 + i,
             "samples_per_s_ci_low": math.nan, "samples_per_s_ci_high": math.nan} for i in range(12)]
    rows.append({**rows[0], "precision": "fp32", "samples_per_s": 40.0})
    plots.throughput(pd.DataFrame(rows), tmp_path)
    fig = figs[0]
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= axes_box.x1, (legend, axes_box)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == 13 and "fw0 bf16" in labels and "fw0 fp32" in labels
    colours = {mcolors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert len(colours) == 13
    title = fig._suptitle.get_window_extent(renderer)
    tight = fig.get_tightbbox(renderer)   # what bbox_inches="tight" saves
    assert tight.x0 <= title.x0 / fig.dpi and title.x1 / fig.dpi <= tight.x1
    assert tight.x1 >= legend.x1 / fig.dpi


def _layout_problems(fig, name: str) -> list[str]:
    """What covers what in a drawn figure: a legend over any axes (its data), a title over an
    axes or another title, anything the saved file (bbox_inches="tight") would clip."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    saved = fig.get_tightbbox(r)                         # inches, what _save writes
    data_axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    boxes = {f"axes {i}": ax.get_window_extent(r) for i, ax in enumerate(fig.axes)}
    texts = {}
    for i, ax in enumerate(data_axes):
        if ax.get_legend() is not None:
            texts[f"legend of axes {i}"] = ax.get_legend().get_window_extent(r)
        if ax.get_title():
            texts[f"title of axes {i}"] = ax.title.get_window_extent(r)
    if fig._suptitle is not None:
        texts["suptitle"] = fig._suptitle.get_window_extent(r)
    problems = []
    for what, box in texts.items():
        problems += [f"{name}: {what} covers {a}" for a, ab in boxes.items() if box.overlaps(ab)]
        problems += [f"{name}: {what} covers {o}" for o, ob in texts.items() if o < what and box.overlaps(ob)]
        inches = box.transformed(fig.dpi_scale_trans.inverted())
        if not (saved.x0 <= inches.x0 + 1e-6 and inches.x1 <= saved.x1 + 1e-6
                and saved.y0 <= inches.y0 + 1e-6 and inches.y1 <= saved.y1 + 1e-6):
            problems.append(f"{name}: {what} is clipped by the saved image")
    return problems


def test_no_plot_title_or_legend_covers_data_or_is_clipped(tmp_path, monkeypatch):
    """Every plot the report draws, on runs with curves, scaling, memory, communication and MFU:
    legends sit beside the axes (they covered bars and lines where matplotlib's "best" found no
    room), titles clear every axes, and nothing is cut off the saved PNG."""
    from ddlbench.report import plots
    root = tmp_path / "runs"
    evals = [{"step": s, "epoch": s / 4, "time_s": s * 0.5, "loss": 3.0 - 0.1 * s, "accuracy": 0.1 * s}
             for s in range(0, 9, 2)]
    for fw, variant in (("ddp", "default"), ("fsdp2", "full"), ("deepspeed", "zero2"), ("horovod", "default")):
        for world in (1, 2, 4):
            rec = make_record(f"{fw}{world}", framework=fw, variant=variant, world=world,
                              sps=100.0 * world ** 0.8, ttt=4.0, evals=evals)
            rec["comm"] = {"per_step_bytes": {"all_reduce": 1e6 * (world - 1)}, "wire_bytes_per_rank": 2e6,
                           "analytic_wire_bytes_per_rank": 2e6}
            write(root, rec)
    rep = report.build([str(root)], tmp_path / "out", progress=False)
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: (fig.tight_layout(), figs.append((path.stem, fig)), path)[2])
    for fn in (plots.throughput, plots.scaling, plots.memory, plots.communication, plots.mfu, plots.best_heatmap):
        fn(rep.cells, tmp_path)
    for _name, *args in plots.convergence_jobs(rep.summary, rep.records, tmp_path):
        plots.convergence(*args)
    assert sorted(n for n, _ in figs) == sorted(
        ["throughput", "scaling", "memory", "communication", "mfu", "best", "convergence_gpt2_tiny_markov"])
    problems = [p for name, fig in figs for p in _layout_problems(fig, name)]
    assert not problems, problems


def test_configurations_that_would_look_alike_say_how_they_differ_by_hand():
    """Found reading the H200 report: four DDP gpt2_small bf16 rows (compiled or not, another
    micro-batch, the old fast path) were indistinguishable in the comparison."""
    from ddlbench.report.frame import distinguishing_settings
    base = {"run": {"compile": False, "global_batch": 8, "dir": "/a", "repeat": 0}, "optim": {"lr": 1e-3},
            "logger": {"name": "none"}}
    compiled = {**base, "run": {**base["run"], "compile": True, "dir": "/b"}}
    bigger = {**base, "run": {**base["run"], "global_batch": 32, "repeat": 1}, "optim": {"lr": [1, 2]}}
    other_model = {**base, "run": {**base["run"], "compile": True}}
    groups = [("ddp", "m", 1, "bf16")] * 3 + [("ddp", "other", 1, "bf16")]
    assert distinguishing_settings([base, compiled, bigger, other_model], groups) == [
        "optim.lr=0.001 run.compile=false run.global_batch=8",     # run.dir and run.repeat are volatile
        "optim.lr=0.001 run.compile=true run.global_batch=8",
        "optim.lr=[1,2] run.compile=false run.global_batch=32",
        ""]                                                         # alone in its group


def test_parity_shows_each_frameworks_design_and_flags_what_the_user_set(tmp_path):
    """DeepSpeed reduces gradients in bf16 by design: shown, not flagged. DDP with a bf16 comm
    hook beside plain DDP is a user's override (one framework, two reduce dtypes): flagged. Two
    optim.impl choices are flagged; a framework's own optimizer is its design."""
    root = tmp_path / "runs"
    specs = [("ddp", "ddp", "default", "fp32", "fused"), ("ddp_hook", "ddp", "bf16_hook", "bf16", "fused"),
             ("ds", "deepspeed", "zero2", "bf16", "fused"), ("ds_off", "deepspeed", "zero2_offload", "bf16",
                                                              "DeepSpeedCPUAdam"),
             ("fsdp", "fsdp2", "full_shard", "fp32", "foreach")]
    for run_id, fw, variant, reduce, impl in specs:
        rec = make_record(run_id, framework=fw, variant=variant)
        rec["framework"].update(grad_reduce_dtype=reduce, optimizer_impl=impl)
        write(root, rec)
    rep = report.build([str(root)], tmp_path / "out", progress=False)
    flagged = {r.run_id: r.differs for r in rep.parity.itertuples() if r.differs}
    design = {r.run_id: r.by_design for r in rep.parity.itertuples() if r.by_design}
    assert flagged == {"ddp": ["grad_reduce_dtype"], "ddp_hook": ["grad_reduce_dtype"], "fsdp": ["optimizer_impl"]}
    # bf16 is the most common reduce dtype here (DeepSpeed twice, the hook): FSDP2's fp32 is its design
    assert design == {"fsdp": ["grad_reduce_dtype"]}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "By design, not flagged: grad_reduce_dtype differ between frameworks" in md


def test_a_flagged_window_says_how_much_its_slowest_step_moved_it_and_the_window_that_would_not():
    """One 0.25 s collection in a 5 s window moves the figure 5%: 25 s of window keep one such step
    under 1% (run.min_window_s=25); a record from before the field says nothing more."""
    from types import SimpleNamespace

    import pandas as pd

    from ddlbench.report.sections import steady_window_notes
    rows = [{"label": "fsdp2", "run_id": "a", "samples_per_s": 90.0, "samples_per_s_median_step": 95.0,
             "window_outlier": True, "window_s": 5.0, "slowest_step_moves": 0.05},
            {"label": "ddp", "run_id": "b", "samples_per_s": 99.0, "samples_per_s_median_step": 99.5,
             "window_outlier": False, "window_s": 5.0, "slowest_step_moves": 0.002},
            {"label": "old", "run_id": "c", "samples_per_s": 80.0, "samples_per_s_median_step": 85.0,
             "window_outlier": True, "window_s": float("nan"), "slowest_step_moves": float("nan")}]
    (note,) = steady_window_notes(SimpleNamespace(summary=pd.DataFrame(rows)))
    assert note.startswith("2 run(s) had outlying steps")
    assert ("fsdp2 (a): window 90.0, median step 95.0 samples/s, its slowest step alone 5.0% of the window's "
            "figure (run.min_window_s=25 keeps one such step under 1%)") in note
    assert "old (c): window 80.0, median step 85.0 samples/s." in note and "ddp (b)" not in note
