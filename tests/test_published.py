"""`bench project published=FILE` (ddlbench/project/published.py): the arithmetic by hand, bad
files refused with the reason, each stack calibrated once and its rows predicted with that
efficiency, and the committed suite held: no row's error grows past what reports/published/ says
today, so a change that worsens the predictor against published tables is seen."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ddlbench.errors import ConfigError
from ddlbench.project import published as pub

REPO = Path(__file__).resolve().parents[1]
SUITES = sorted((REPO / "benchmarks" / "published").glob("*.yaml"))


def test_errors_pairs_and_summary_by_hand():
    rows = pub.errors([
        {"id": "a", "tokens_per_s": 100, "predicted_tokens_per_s": 100.0, "memory_gib": 80, "predicted_memory_gib": 60.0,
         "calibration": True},
        {"id": "b", "tokens_per_s": 200, "predicted_tokens_per_s": 230.0, "memory_gib": None, "calibration": False,
         "fits": False},
        {"id": "c", "tokens_per_s": 50, "predicted_tokens_per_s": 45.0, "memory_gib": 40, "predicted_memory_gib": 44.0,
         "calibration": False},
        {"id": "d", "tokens_per_s": 10, "unpriced": "no layout", "calibration": False}])
    assert rows[1]["error"] == pytest.approx(0.15) and "memory_error" not in rows[1]
    assert rows[0]["memory_error"] == pytest.approx(-0.25) and rows[2]["memory_error"] == pytest.approx(0.10)
    ratios = pub.pair_ratios(rows, [["b", "a"], ["d", "c"]])
    # published 200 / 100 = 2, predicted 230 / 100 = 2.3: +15%; a pair with an unpriced row has no prediction
    assert ratios[0]["published"] == 2 and ratios[0]["predicted"] == pytest.approx(2.3)
    assert ratios[0]["error"] == pytest.approx(0.15) and ratios[1]["predicted"] is None and ratios[1]["error"] is None
    s = pub.summary(rows, ratios)
    # the calibration row is exact by construction: b (+15%) and c (-10%) only
    assert s["throughput"] == {"n": 2, "median": pytest.approx(0.125), "worst": pytest.approx(0.15)}
    assert s["memory"]["n"] == 2 and s["memory"]["worst"] == pytest.approx(0.25)
    assert s["pairs"]["n"] == 1 and s["unpriced"] == 1
    # every published row ran: b, estimated over its device's memory, is named (a, c: fits unknown, not named)
    assert s["not_fitting"] == ["b"]
    table = pub.text({"stacks": {}}, [{**r, "stack": "s", "efficiency": 0.4, "table": 1, "world": 8} for r in rows],
                     ratios, s)
    assert table.endswith("predicted not to fit the device's memory, though they ran: b")


def _write(tmp_path, doc) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


GOOD = {"source": "x", "common": ["hardware=H100"], "stacks": {"s": {"calibrate": "r1"}},
        "rows": [{"id": "r1", "stack": "s", "world": 8, "tokens_per_s": 100, "spec": ["model=llama_8b"]},
                 {"id": "r2", "stack": "s", "world": 64, "tokens_per_s": 90, "spec": ["model=llama_8b"]},
                 {"id": "r3", "stack": "s", "world": 64, "tokens_per_s": 9, "unpriced": "CP x PP"}],
        "pairs": [["r2", "r1"]]}


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["rows"][1].update(stack="t"), "stack 't' is not one of"),
    (lambda d: d["rows"][1].pop("spec"), "needs spec"),
    (lambda d: d["rows"][1].update(id="r1"), "given twice"),
    (lambda d: d["rows"][1].pop("tokens_per_s"), "needs tokens_per_s"),
    (lambda d: d["stacks"]["s"].update(calibrate="r3"), "not a priced row"),
    (lambda d: d.update(pairs=[["r2", "r9"]]), "must name two rows"),
    (lambda d: d.update(tables=1), "unknown keys"),
    (lambda d: d["rows"][0].update(extra=1), "a mapping of"),
    (lambda d: d.update(memory_is="peak"), "memory_is must be allocated or reserved"),
    (lambda d: d["stacks"]["s"].update(attention_as="s"), "attention_as must name a stack above it"),
    (lambda d: d["stacks"]["s"].update(args="kernels=fused"), "args must be a list of bench project key=value"),
])
def test_bad_suites_are_refused_with_the_reason(tmp_path, edit, message):
    doc = json.loads(json.dumps(GOOD))
    edit(doc)
    with pytest.raises(ConfigError, match=message):
        pub.load(_write(tmp_path, doc))


def test_each_stack_is_calibrated_once_and_its_rows_predicted_with_that_efficiency(tmp_path):
    calls = []

    def fake(args):
        calls.append(args)
        world = int(next(a for a in args if a.startswith("world_sizes="))[len("world_sizes=["):-1])
        if any(a.startswith("calibrate=") for a in args):
            return {"efficiency": 0.4, "rows": [{"tokens_per_s_per_device": 100.0, "memory_per_rank_bytes": 2**30}]}
        return {"rows": [{"tokens_per_s_per_device": 100.0 * 8 / world ** 0.5 / 8 ** 0.5,
                          "memory_per_rank_bytes": 3 * 2**30}]}
    rows = pub.predict(pub.load(_write(tmp_path, GOOD)), fake)
    assert calls[0] == ["hardware=H100", "model=llama_8b", "world_sizes=[8]", "calibrate=100@8"]
    assert calls[1][-1] == "mfu=0.4" and len(calls) == 3      # r1 and r2 priced with 0.4; r3 unpriced
    assert [r["calibration"] for r in rows] == [True, False, False]
    assert rows[1]["predicted_tokens_per_s"] == pytest.approx(100 * 8 ** 0.5 / 64 ** 0.5)
    assert rows[1]["error"] == pytest.approx(rows[1]["predicted_tokens_per_s"] / 90 - 1)
    assert rows[2]["unpriced"] == "CP x PP" and "error" not in rows[2]


@pytest.mark.slow
@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_the_committed_suite_is_held_to_todays_errors(path, tmp_path):
    """Every row predicted again: its throughput and memory errors no worse than the committed
    figures (reports/published/<suite>.json, `bench project published=FILE`) by more than half a
    point; the same rows priced and unpriced."""
    from conftest import bench
    committed = json.loads((REPO / "reports" / "published" / f"{path.stem}.json").read_text())
    proc = bench("project", f"published={path}", f"out={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    now = json.loads((tmp_path / "published.json").read_text())
    then = {r["id"]: r for r in committed["rows"]}
    for r in now["rows"]:
        was = then[r["id"]]
        assert bool(r.get("unpriced")) == bool(was.get("unpriced")), r["id"]
        for key in ("error", "memory_error"):
            if was.get(key) is not None:
                assert abs(r[key]) <= abs(was[key]) + 0.005, (r["id"], key, r[key], was[key])
    assert "median |error|" in proc.stdout and now["summary"]["unpriced"] == committed["summary"]["unpriced"]
    # no row that ran newly estimated not to fit its device's memory
    assert set(now["summary"]["not_fitting"]) <= set(committed["summary"]["not_fitting"]), now["summary"]["not_fitting"]


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_docs_table_is_the_committed_suites(path):
    """docs/projection.md holds each committed suite's table (`published.text` of its record), line for line."""
    rec = json.loads((REPO / "reports" / "published" / f"{path.stem}.json").read_text())
    lines = pub.text(pub.load(path), rec["rows"], rec["pairs"], rec["summary"]).splitlines()
    doc = (REPO / "docs" / "projection.md").read_text()
    ids = {r["id"] for r in rec["rows"]}
    table = [line for line in lines if line.startswith("throughput: median")
             or line.startswith("| ") and line.split("|")[1].strip().split(" / ")[0] in ids]
    assert len(table) == len(rec["rows"]) + len(rec["pairs"]) + 1
    missing = [line for line in table if line not in doc]
    assert not missing, missing


def test_a_stack_prices_its_attention_at_an_earlier_stacks_efficiency(tmp_path):
    """attention_as: the earlier stack's calibrated efficiency passed as attention_efficiency= to the
    later stack's calibration and to each of its rows; the stack's args after it, to both alike."""
    doc = json.loads(json.dumps(GOOD))
    doc["stacks"] = {"bf16": {"calibrate": "r1"},
                     "f8": {"calibrate": "r2", "attention_as": "bf16", "args": ["kernels=fused"]}}
    for r in doc["rows"]:
        r["stack"] = "bf16"
    doc["rows"][1]["stack"] = "f8"
    doc["rows"].append({"id": "r4", "stack": "f8", "world": 128, "tokens_per_s": 80, "spec": ["model=llama_8b"]})
    calls = []

    def fake(args):
        calls.append(args)
        eff = 0.3 if "calibrate=100@8" in args else 0.5
        return {"efficiency": eff, "rows": [{"tokens_per_s_per_device": 90.0, "memory_per_rank_bytes": 2**30}]}
    rows = pub.predict(pub.load(_write(tmp_path, doc)), fake)
    assert calls[0][-1] == "calibrate=100@8"                                  # bf16: no attention argument
    assert calls[1][-3:] == ["calibrate=90@64", "attention_efficiency=0.3", "kernels=fused"]   # f8's calibration
    r4 = next(c for c in calls if "world_sizes=[128]" in c)
    assert r4[-3:] == ["mfu=0.5", "attention_efficiency=0.3", "kernels=fused"] and rows[-1]["efficiency"] == 0.5


@pytest.mark.parametrize("args,message", [
    (["memory_tbs=3.35", "hardware=H100"], "give kernels=eager or kernels=fused with it"),
    (["kernels=fused", "peak_tflops=100"], "give memory_tbs= "),
    (["kernels=fused", "hardware=cpu_probe"], "has no peak in conf/hardware/auto.yaml"),
    (["kernels=fast", "hardware=H100"], "kernels"),
])
def test_the_other_ops_bytes_need_a_memory_rate(args, message):
    """kernels=eager|fused prices the ops other than matmuls at the memory's rate: memory_tbs=, or the hardware's hbm
    (gpu_table); memory_tbs= alone, or kernels= with no rate, is refused with the reason before anything is planned."""
    from ddlbench.project import spec_command
    with pytest.raises(ConfigError, match=message):
        spec_command.run(["model=gpt2_tiny", "framework=ddp", "network=dgx_h100", *args])


