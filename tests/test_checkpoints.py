"""run.checkpoint (issue 67): every framework family saves its training state inside a run, its own
recommended way (ddlbench/adapters/checkpoint.py), and the record says what each save cost
(ddlbench/rank/saves.py, metrics/checkpoint.py); the arithmetic by hand, the refusals with their
reasons, and one sweep per mode over the families that offer it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench, for_runs

from ddlbench.metrics.checkpoint import persist_slowdown, rate, summarize_saves
from ddlbench.planning.config import plan_from_overrides
from ddlbench.record.results import load_result


def test_persist_slowdown_by_hand():
    # steps ending at 1..6 s, 1 s each, but the two inside the save's write (2, 4] took 1.5 and 1.3
    steps = [(1, 1.0), (2, 1.0), (3, 1.5), (4, 1.3), (5, 1.0), (6, 1.0)]
    got = persist_slowdown(steps, 2.0, 4.0, 1.0)
    assert got["steps"] == 2 and got["mean_step_s"] == pytest.approx(1.4) and got["excess"] == pytest.approx(0.4)
    # a write done within one step (2.2 to 2.6 s) slowed that step, the one from 1.5 to 3 s
    got = persist_slowdown(steps, 2.2, 2.6, 1.0)
    assert got["steps"] == 1 and got["excess"] == pytest.approx(0.5)
    # a write durable after the last step: no step ran beside it, nothing to say
    assert persist_slowdown(steps, 6.0, 6.5, 1.0) == {"steps": 0, "mean_step_s": None, "excess": None}
    assert rate(10, 2.0) == 5.0 and rate(None, 2.0) is None and rate(10, 0) is None


def test_saves_over_ranks_by_hand():
    r0 = [{"step": 4, "blocked_s": 0.1, "waited_s": 0.05, "durable_s": 0.5, "bytes": 100, "slowdown": {"excess": 0.2},
           "files": 3, "pinned_bytes": 100}]
    r1 = [{"step": 4, "blocked_s": 0.3, "waited_s": 0.0, "durable_s": 0.4, "bytes": 60, "slowdown": {"excess": 0.1},
           "error": "x", "files": None, "pinned_bytes": 60}]
    (row,) = summarize_saves([r0, r1])
    # the loop waited for its slowest rank; durable when the last write was; bytes summed; the worst slowdown;
    # the files rank 0 counted; each rank's pinned staging
    assert row == {"step": 4, "blocked_s": 0.3, "waited_s": 0.05, "durable_s": 0.5, "bytes_per_rank": [100, 60], "bytes": 160,
                   "files": 3, "pinned_bytes_per_rank": [100, 60], "slowdown": 0.2, "errors": ["x"]}


@pytest.mark.parametrize("framework,mode,why", [
    ("deepspeed_zero2", "async", "saves only in mode sync"),
    ("fairscale_oss", "async", "saves only in mode sync"),
])
def test_a_mode_the_framework_does_not_offer_is_unsupported_with_the_reason(framework, mode, why):
    plan = plan_from_overrides([f"framework={framework}", "run.checkpoint.every=2", f"run.checkpoint.mode={mode}"])
    assert why in plan.variant.unsupported_reason(plan.cfg, "cpu")
    plan = plan_from_overrides([f"framework={framework}", "run.checkpoint.every=2"])
    assert plan.variant.unsupported_reason(plan.cfg, "cpu") is None


def test_pinned_staging_is_for_a_gpu():
    """async_pinned stages through pinned host memory (a GPU's copies): unsupported on CPU, saying why;
    offered on CUDA by every DCP-saving strategy; DeepSpeed's engine saves sync only."""
    plan = plan_from_overrides(["framework=fsdp_full", "run.checkpoint.every=2", "run.checkpoint.mode=async_pinned"])
    assert "runs on CUDA only: pinned host memory" in plan.variant.unsupported_reason(plan.cfg, "cpu")
    from ddlbench.adapters.variant import checkpoint_reason
    assert checkpoint_reason(plan.variant, plan.cfg, "cuda") is None
    plan = plan_from_overrides(["framework=deepspeed_zero2", "run.checkpoint.every=2", "run.checkpoint.mode=async_pinned"])
    assert "saves only in mode sync" in checkpoint_reason(plan.variant, plan.cfg, "cuda")


def test_bad_checkpoint_settings_are_config_errors():
    from ddlbench.errors import ConfigError
    for bad in ("run.checkpoint.every=-1", "run.checkpoint.mode=later", "run.checkpoint.keep=0"):
        with pytest.raises(ConfigError, match="run.checkpoint"):
            plan_from_overrides([bad])


# one sweep per mode: the families that offer async save so, the others as they can; records by family
SWEEPS = {"async": "ddp,fsdp_full,pipeline_1f1b", "sync": "deepspeed_zero2,horovod,fairscale_oss"}
FAMILIES = {"async": {"ddp", "fsdp2", "pipeline"}, "sync": {"deepspeed", "horovod", "fairscale"}}
STEPS = ("debug=fast", "launcher.nproc=2", "run.measure_steps=4", "run.checkpoint.every=2", "run.checkpoint.keep=2",
         "run.comm_profile=false")


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for mode, frameworks in SWEEPS.items():
        proc = bench("run", "-m", f"framework={frameworks}", f"run.checkpoint.mode={mode}", *STEPS,
                     f"run.dir={root / mode}", timeout=for_runs(3, 90))
        assert proc.returncode == 0, proc.stderr[-3000:]
        for p in sorted((root / mode).glob("*/result.json")):
            rec = load_result(p)
            out[rec["framework"]["name"]] = rec
    return out


def test_every_family_saves_and_the_record_says_what_it_cost(records):
    assert set(records) == FAMILIES["async"] | FAMILIES["sync"]
    for name, rec in records.items():
        assert rec["status"] == "ok", (name, rec["error"])
        ck = rec["checkpoint"]
        mode = ck["mode"]
        assert mode == ("async" if name in FAMILIES["async"] else "sync") and ck["every"] == 2
        # 4 measured steps, a save every 2: after measured steps 2 and 4 (warm-up 1: steps 3 and 5)
        assert [s["step"] for s in ck["saves"]] == [3, 5], name
        for s in ck["saves"]:
            assert not s["errors"] and s["durable_s"] is not None, (name, s)
            assert 0 < s["blocked_s"] <= s["durable_s"], (name, s)
            if mode == "sync":
                assert s["blocked_s"] == s["durable_s"] and s["slowdown"] is None
            assert len(s["bytes_per_rank"]) == 2 and s["bytes"] == sum(s["bytes_per_rank"]) > 0, (name, s)
            # DCP: .metadata and a file per rank; DeepSpeed: model states and each rank's partition; rank 0's file
            assert s["files"] == {"ddp": 3, "fsdp2": 3, "pipeline": 3, "deepspeed": 3}.get(name, 1), (name, s)
            assert s["pinned_bytes_per_rank"] == [0, 0]
        assert ck["bytes_per_s"] > 0 and ck["plain_write_bytes_per_s"] > 0 and ck["wait_at_end_s"] >= 0
        # keep=2: the two newest saves are left on disk (DeepSpeed adds its `latest` tag and scripts beside them)
        left = sorted(p.name for p in Path(ck["dir"]).iterdir() if p.is_dir())
        assert left == ["step_3", "step_5"], (name, left)
        assert ck["restore"] is None


def test_a_dcp_checkpoint_holds_every_rank_s_state_under_keys_of_its_own(records):
    """DCP's metadata: the model's parameters and the optimizer's state per parameter, flattened; a
    pipeline's stages under keys of their own (stage0..., stage1...), so no rank's state replaces another's."""
    from torch.distributed.checkpoint import FileSystemReader
    for name in FAMILIES["async"]:
        path = Path(records[name]["checkpoint"]["dir"]) / "step_5"
        keys = set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
        model = {k[len("model."):] for k in keys if k.startswith("model.")}
        stepped = {k[len("optimizer.state."):-len(".exp_avg")] for k in keys
                   if k.startswith("optimizer.state.") and k.endswith(".exp_avg")}
        # every parameter's AdamW state, once: GPT-2's head is its embedding (tied; a pipeline's last
        # stage holds its own copy, with its own state)
        assert stepped <= model and model - stepped <= {"net.lm_head.weight"}, (name, sorted(model - stepped))
        assert any(k.startswith("optimizer.param_groups.") and k.endswith(".lr") for k in keys)   # flattened
        if name == "pipeline":
            assert {k.split(".")[0] for k in model} == {"stage0", "stage1"}


def test_summary_and_report_carry_the_saves(records):
    from ddlbench.report.frame import summary_row
    from ddlbench.report.render import checkpoint_table
    row = summary_row(records["fsdp2"])
    ck = records["fsdp2"]["checkpoint"]
    assert (row["checkpoint_mode"], row["checkpoint_blocked_s"], row["checkpoint_bytes"]) == \
        ("async", ck["blocked_s_median"], ck["bytes_per_save"])

    class Rep:
        pass
    rep = Rep()
    rep.records = records
    head, rows = checkpoint_table(rep)
    assert len(rows) == len(records) and head[4] == "mode"
    assert json.dumps(rows)          # every cell a string


def _losses(rec: dict) -> list[float]:
    return [loss for _, loss in rec["convergence"]["train_loss"]]


# (the run saved, what resumes from its step_3: framework, ranks, relative tolerance on the losses)
RESUMES = [("ddp", "ddp", 2, 0.0),                 # the same layout: the same arithmetic, exactly
           ("deepspeed", "deepspeed_zero2", 2, 0.0),
           ("fsdp2", "fsdp_full", 1, 1e-6),         # FSDP2 over 2 ranks -> 1 (DCP reshards)
           ("fsdp2", "ddp", 1, 1e-6)]              # ... and into another strategy


def test_resumed_runs_go_on_where_the_saved_one_did(records, tmp_path):
    """run.checkpoint.resume_from=<dir>/step_3: the next 2 steps' losses are the saved run's steps 3 and 4
    (exactly where the layout is the same; within 1e-6 relative on another world size or strategy),
    the restore timed by phase; a layout whose parameters differ in shape is refused, saying which."""
    for saved, framework, nproc, rtol in RESUMES:
        src = records[saved]
        path = Path(src["checkpoint"]["dir"]) / "step_3"
        proc = bench("run", f"framework={framework}", f"launcher.nproc={nproc}", "debug=fast", "run.measure_steps=1",
                     "run.comm_profile=false", f"run.checkpoint.resume_from={path}", f"run.dir={tmp_path / framework}-{nproc}")
        rec = load_result(tmp_path / f"{framework}-{nproc}" / "result.json")
        assert rec["status"] == "ok", (saved, framework, rec["error"], proc.stderr[-2000:])
        assert _losses(rec) == pytest.approx(_losses(src)[3:5], rel=rtol, abs=0), (saved, framework)
        restore = rec["checkpoint"]["restore"]
        assert restore["step"] == 3 and restore["path"] == str(path) and restore["read_s"] > 0
        assert restore["first_step_s"] > 0 and restore["load_s"] >= restore["read_s"]
    # GPT-2 under tensor parallelism holds its Conv1D weights transposed (nn.Linear): not this checkpoint's shape
    bad = tmp_path / "tp"
    bench("run", "framework=tensor_parallel", "launcher.nproc=2", "debug=fast", "run.comm_profile=false",
          f"run.checkpoint.resume_from={Path(records['fsdp2']['checkpoint']['dir']) / 'step_3'}", f"run.dir={bad}")
    rec = load_result(bad / "result.json")
    assert rec["status"] == "failed" and "RestoreError" in rec["error"]["type"] + rec["error"]["message"]
    assert "Size mismatch between saved" in rec["error"]["message"] and "c_attn.weight" in rec["error"]["message"]


def test_a_killed_rank_recovers_under_the_elastic_agent(records, tmp_path):
    """launcher.max_restarts=1: rank 1 SIGKILLed before step 4 (of a run that saved after steps 3);
    torch's elastic agent restarts both ranks, which resume from step_3, the newest complete save,
    and go on exactly as the uninterrupted run did; the record says what the failure cost, by phase."""
    run = tmp_path / "recovered"
    proc = bench("run", "framework=ddp", "launcher.nproc=2", *STEPS, "launcher.max_restarts=1", "fault.kind=kill",
                 "fault.rank=1", "fault.step=4", f"run.dir={run}", timeout=for_runs(2))
    rec = load_result(run / "result.json")
    assert rec["status"] == "ok", (rec["error"], proc.stderr[-3000:])
    r = rec["recovery"]
    assert r["attempts"] == 2 and r["fault"] == {"rank": 1, "step": 4, "kind": "kill"}
    assert r["resumed_from_step"] == 3 and r["steps_lost"] == 1
    phases = [r[k] for k in ("detect_s", "relaunch_s", "process_group_s", "model_build_s", "restore_s", "redo_s")]
    assert all(p is not None and p >= 0 for p in phases), r
    assert r["restore_s"] > 0 and r["lost_s"] == pytest.approx(sum(phases))
    assert any("the run was restarted (1 time(s)): rank 1 failed (kill, injected) at step 4" in w
               for w in rec["warnings"]), rec["warnings"]
    # the second attempt trained from step 3 on: its steps 3 and 4 are the uninterrupted run's, exactly
    assert _losses(rec)[:2] == _losses(records["ddp"])[3:5]
    assert rec["checkpoint"]["restore"]["step"] == 3 and rec["startup_s"]["total_to_first_step"] > 0
    # the second attempt (1 warm-up step, 4 measured, a save every 2) saved at steps 6 and 8 (keep=2),
    # each marked complete; the first attempt's step_3 went once they had landed
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert left == ["step_6", "step_8"] and all((run / "checkpoints" / n / "COMPLETE").is_file() for n in left)
    assert sorted(p.name for p in (run / "logs").glob("*/attempt_*")) == ["attempt_0", "attempt_1"]
    # goodput prices a restart as this one measured it: to the new attempt's state, then the read
    from ddlbench.project.goodput import table
    doc = table(rec, [{"devices": 1024, "step_s": 0.5, "samples_per_s": 1000.0}])
    assert doc["restart_s"] == pytest.approx(r["lost_s"] - r["redo_s"]) and doc["read_s"] == r["restore_s"]
    assert doc["read_source"].startswith("both measured")
    # summary.csv and the report's checkpoint table carry it
    from ddlbench.report.frame import summary_row
    from ddlbench.report.render import checkpoint_table
    row = summary_row(rec)
    assert (row["recovery_attempts"], row["recovery_steps_lost"], row["recovery_lost_s"]) == (2, 1, r["lost_s"])
    (cells,) = checkpoint_table(type("Rep", (), {"records": {"r": rec}}))[1]
    assert cells[-1] == f"{r['lost_s']:.2f} s (1 steps redone)"


def test_a_zero_save_reshards_through_deepspeed_s_universal_checkpoint(records, tmp_path):
    """ZeRO-2 saved on 2 ranks does not load on 1 (DeepSpeed: "used a DP world size of 2"); converted by
    DeepSpeed's ds_to_universal it does, and the next 2 losses are the saved run's within 1e-6."""
    import subprocess
    import sys

    from conftest import run_bounded
    saved = Path(records["deepspeed"]["checkpoint"]["dir"]) / "step_3"
    conv = run_bounded([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(saved),
                        "--output_folder", str(tmp_path / "u" / "step_3"), "--inject_missing_state"], 300,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert conv.returncode == 0, conv.stderr[-2000:]
    for path, name in ((saved, "plain"), (tmp_path / "u" / "step_3", "universal")):
        bench("run", "framework=deepspeed_zero2", "launcher.nproc=1", "debug=fast", "run.measure_steps=1",
              "run.comm_profile=false", f"run.checkpoint.resume_from={path}", f"run.dir={tmp_path / name}")
    plain, universal = (load_result(tmp_path / n / "result.json") for n in ("plain", "universal"))
    assert plain["status"] == "failed" and "DP world size of 2" in plain["error"]["message"]
    assert universal["status"] == "ok", universal["error"]
    assert _losses(universal) == pytest.approx(_losses(records["deepspeed"])[3:5], rel=1e-6, abs=0)


def test_async_saves_in_dcp_s_background_process(records, tmp_path):
    """run.checkpoint.mode=async_process (DCP's AsyncCheckpointerType.PROCESS, on CPU too): the rank
    stages its state and returns; DCP's own process writes it. Each save durable after it returned, the
    newest marked COMPLETE, whole as DCP reads it (every file its metadata names, long enough: the check a
    restore makes first; resuming a DCP save is tested above), and training unchanged by it."""
    run = tmp_path / "proc"
    proc = bench("run", "framework=fsdp_full", *STEPS, "run.checkpoint.mode=async_process", f"run.dir={run}",
                 timeout=for_runs(1, 120))
    rec = load_result(run / "result.json")
    assert rec["status"] == "ok", (rec["error"], proc.stderr[-2000:])
    ck = rec["checkpoint"]
    assert ck["mode"] == "async_process" and [s["step"] for s in ck["saves"]] == [3, 5]
    for s in ck["saves"]:
        assert not s["errors"] and 0 < s["blocked_s"] <= s["durable_s"] and s["bytes"] > 0, s
    assert (run / "checkpoints" / "step_5" / "COMPLETE").is_file()
    assert _losses(rec) == _losses(records["fsdp2"])      # a save never changes what is trained
    from ddlbench.adapters.checkpoint import check_files
    for step in ("step_3", "step_5"):
        check_files(run / "checkpoints" / step)


def test_a_resume_path_must_name_a_save():
    from ddlbench.rank.saves import RestoreError, resumed_step
    assert resumed_step("/x/checkpoints/step_12") == 12
    with pytest.raises(RestoreError, match="not a save's directory"):
        resumed_step("/x/checkpoints/latest")


def test_goodput_arithmetic_by_hand():
    from ddlbench.metrics import goodput as g
    # the default fit through arXiv 2410.21680's points: 256 h / sqrt(N)
    a, b = g.mttf_fit()
    assert b == pytest.approx(0.5) and a == pytest.approx(256 * 3600)
    assert g.mttf(1024) == pytest.approx(8 * 3600) and g.mttf(16384) == pytest.approx(2 * 3600)
    assert g.mttf(4096) == pytest.approx(4 * 3600)
    # an async save blocked 0.5 s and slowed the steps 10% over the 20 s it was written: 2.5 s a save
    assert g.save_cost(0.5, 0.10, 20.0) == pytest.approx(2.5) and g.save_cost(3.0) == 3.0
    # Daly: sqrt(2 x 10 x 28,800) - 10 = 758.95 - 10
    assert g.optimal_interval(10, 28800) == pytest.approx(748.946, abs=1e-3)
    # lost: 10/750 + (750 + 10)/2/28,800 + 300/28,800 = 0.013333 + 0.013194 + 0.010417
    assert g.goodput(750, 10, 300, 28800) == pytest.approx(1 - 0.0369444, abs=1e-6)
    with pytest.raises(ValueError):
        g.goodput(0, 10, 300, 28800)


def test_project_prints_goodput_from_a_run_that_saved(records, tmp_path):
    """The table's inputs from the record by hand, and `bench project` printing it at 1,024 and 16,384."""
    from ddlbench.metrics import goodput as g
    from ddlbench.project.goodput import mttf_points, table
    rec = records["ddp"]
    ck = rec["checkpoint"]
    rows = [{"devices": 1024, "step_s": 0.5, "samples_per_s": 1000.0}]
    doc = table(rec, rows)
    cost = ck["blocked_s_median"] + (ck["slowdown_median"] or 0) * (ck["durable_s_median"] - ck["blocked_s_median"])
    restart = rec["startup_s"]["total_to_first_step"] + ck["durable_s_median"]
    (row,) = doc["rows"]
    assert doc["save_cost_s"] == pytest.approx(cost) and doc["restart_s"] == pytest.approx(restart)
    assert row["interval_s"] == pytest.approx(g.optimal_interval(cost, 8 * 3600))
    assert row["goodput"] == pytest.approx(g.goodput(row["interval_s"], cost, restart, 8 * 3600))
    assert row["run_interval_s"] == 2 * 0.5 and row["effective_samples_per_s"] == pytest.approx(1000 * row["goodput"])
    assert table({"checkpoint": None}, rows) is None
    assert mttf_points("512:10,4096:5") == ((512, 36000.0), (4096, 18000.0))
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="mttf="):
        mttf_points("512:10")
    run_dir = Path(rec["config"]["run"]["dir"])
    proc = bench("project", str(run_dir), "network=dgx_h100", "world_sizes=[1024,16384]", f"out={tmp_path / 'p'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "goodput (checkpoints, failures, restarts)" in proc.stdout
    got = json.loads((tmp_path / "p" / "projection.json").read_text())["goodput"]
    assert [r["devices"] for r in got["rows"]] == [1024, 16384]
    assert got["rows"][0]["mttf_s"] == pytest.approx(8 * 3600) and got["rows"][1]["mttf_s"] == pytest.approx(2 * 3600)


def test_a_save_that_cannot_be_written_fails_the_save_not_the_run(tmp_path):
    """run.checkpoint.dir under a file (what a full or vanished volume looks like to the writer): the
    run is ok, the save's row holds every rank's error, and the record's warnings say so."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = bench("run", "framework=ddp", "launcher.nproc=2", "debug=fast", "run.comm_profile=false",
                 "run.checkpoint.every=2", f"run.checkpoint.dir={blocker / 'ck'}", f"run.dir={tmp_path / 'run'}")
    rec = load_result(tmp_path / "run" / "result.json")
    assert proc.returncode == 0 and rec["status"] == "ok", rec["error"]
    (save,) = rec["checkpoint"]["saves"]
    assert save["durable_s"] is None and save["errors"] and all("Not a directory" in e for e in save["errors"])
    assert any(w.startswith("run.checkpoint: 1 of 1 saves failed; the first at step 3: ") for w in rec["warnings"])


def test_damaged_or_foreign_checkpoints_are_refused_naming_why(records, tmp_path):
    """A torn file (truncated), a save without its .metadata (cut short), another model's save: each
    run fails with RestoreError naming the file or the key, before any state is applied."""
    import shutil
    saved = Path(records["ddp"]["checkpoint"]["dir"]) / "step_3"
    torn = tmp_path / "torn" / "step_3"
    shutil.copytree(saved, torn)
    with open(torn / "__1_0.distcp", "r+b") as f:
        f.truncate(1000)
    cut = tmp_path / "cut" / "step_3"
    shutil.copytree(saved, cut)
    (cut / ".metadata").unlink()
    cases = [(torn, "model=gpt2_tiny", f"{torn / '__1_0.distcp'} is torn: 1000 bytes, its metadata needs"),
             (cut, "model=gpt2_tiny", f"{cut / '.metadata'} is missing: not a finished DCP save"),
             (saved, "model=llama_tiny", "Missing key in checkpoint state_dict: model.net.model.embed_tokens.weight")]
    for i, (path, model, why) in enumerate(cases):
        bench("run", "framework=ddp", model, "launcher.nproc=2", "debug=fast", "run.comm_profile=false",
              f"run.checkpoint.resume_from={path}", f"run.dir={tmp_path / f'run{i}'}")
        rec = load_result(tmp_path / f"run{i}" / "result.json")
        assert rec["status"] == "failed" and why in rec["error"]["message"], rec["error"]
        assert rec["error"]["message"].startswith(f"RestoreError: run.checkpoint.resume_from={path}: "), rec["error"]
