"""Real runs: DDP at 1 and 2 ranks on CPU/gloo, the equivalence gate, and failures as data."""
import json
import re

import pytest
from conftest import HOLD_AT_STEP_3, run_record, wait_until_held, wait_until_training

from ddlbench.launch.local import formed
from ddlbench.lifecycle import events
from ddlbench.record.results import check_record

FAST = ("run.warmup_steps=1", "run.measure_steps=3")


@pytest.mark.parametrize("nproc", [1, 2])
def test_ddp_writes_a_valid_result(run_dir, nproc):
    # at 2 ranks: the product's default profiled comm step (run_record turns it off), one more step under
    # torch.profiler after everything, a warm-up until the steps settle and a window sized by time after it
    more = ("run.comm_profile=true", "run.trace=true", "run.warmup_max_steps=10", "run.min_window_s=1.5") if nproc == 2 else ()
    proc, rec = run_record(run_dir, "framework=ddp", "model=gpt2_tiny", f"launcher.nproc={nproc}", *FAST, *more)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert check_record(rec) == []
    if nproc == 2:   # run.trace
        assert [t["trace"] for t in rec["trace"]["per_rank"]] == ["trace-rank0.json", "trace-rank1.json"]
        assert all(json.loads((run_dir / f"trace-rank{r}.json").read_text())["traceEvents"] for r in (0, 1))
        assert "aten::mm" in (run_dir / "trace-rank0.txt").read_text()
    # the issue time (train_step called -> returned) beside the step time; on CPU nothing is asynchronous
    assert rec["timing"]["launch_bound"]["value"] is None and rec["timing"]["issue_time_s_median"] > 0
    assert rec["status"] == "ok" and rec["parallel"]["world_size"] == nproc
    assert rec["parallel"]["micro_batch"] == 8 // nproc
    # the CPU rank's host allocator, fixed (ddlbench/rank/malloc.py); the median step's figures beside the window's
    assert rec["env"]["malloc"] == {"applied": True, "mmap_threshold": 32 << 20, "trim_threshold": 256 << 20,
                                    "why": rec["env"]["malloc"]["why"]}
    steady = rec["timing"]["window_vs_median"]
    assert steady["median_step_s"] == rec["timing"]["step_time_s"]["median"] and isinstance(steady["outlier"], bool)
    assert rec["throughput"]["samples_per_s_median_step"] == pytest.approx(8 / steady["median_step_s"])
    assert rec["flops"]["mfu_median_step"] == pytest.approx(rec["mfu"] * steady["window_step_s"] / steady["median_step_s"])
    t = rec["timing"]
    steps = 3
    if nproc == 2:   # the slowest rank's warm-up step, agreed over ranks, sets the window's steps (>= 3)
        from ddlbench.metrics.window import window_steps
        rule = t["window_rule"]
        steps = window_steps(3, 1.5, rule["warm_step_s"])
        assert rule["measure_steps"] == steps and rule["requested_measure_steps"] == 3 and rule["min_window_s"] == 1.5
        assert steady["window_s"] == pytest.approx(max(t["per_rank_window_s"]))
        assert 0 <= steady["slowest_step_moves"] <= 1
        # warm-up: at least 1 step, then until every rank's steps settled (metrics/warmup.py), at most 10
        warm = t["warmup_rule"]
        assert warm["steps"] == t["warmup_steps"] and warm["min_steps"] == 1 and warm["max_steps"] == 10
        if warm["stopped"] == "settled":     # 6 steps after step 0 are the fewest the rule judges
            assert 7 <= t["warmup_steps"] <= 10 and all(abs(d) <= 0.05 for d in warm["drift_per_rank"])
        else:
            assert warm["stopped"] == "cap" and t["warmup_steps"] == 10
        assert len(rec["convergence"]["train_loss"]) == t["warmup_steps"] + steps
    else:
        assert "window_rule" not in t and "warmup_rule" not in t and t["warmup_steps"] == 1
    assert t["measured_steps"] == steps and len(t["series_s"]) == steps
    # the host's own events in the window, per rank (ddlbench/rank/hostevents.py): GC seconds per step, no CUDA allocator
    events = t["host_events"]
    assert [len(r["gc"]["per_step_s"]) for r in events["per_rank"]] == [steps] * nproc
    assert all(r["cuda_alloc_retries_in_loop"] is None for r in events["per_rank"])
    # run.gc=freeze (the default): set-up's objects frozen before the loop and after its first step
    assert events["gc_policy"] == "freeze"
    for r in events["per_rank"]:
        assert r["gc_policy"]["policy"] == "freeze"
        assert r["gc_policy"]["frozen_objects"] >= r["gc_policy"]["frozen_objects_before_loop"] > 10_000
        # a rank forked on CPU inherits its launcher's objects frozen (ddlbench/launch/forked.py)
        assert r["gc_policy"]["inherited_frozen_objects"] > 10_000
    assert events["slowest_step"]["step_s"] == max(t["series_s"])
    assert t["step_time_s"]["p10"] <= t["step_time_s"]["median"] <= t["step_time_s"]["p90"]
    tp = rec["throughput"]
    assert t["window_step_s"] == pytest.approx(max(t["per_rank_window_s"]) / steps)
    assert tp["samples_per_s"] == pytest.approx(8 / t["window_step_s"])
    assert tp["tokens_per_s"] == pytest.approx(tp["samples_per_s"] * 128)
    assert len(rec["memory"]["per_rank"]) == nproc
    for m in rec["memory"]["per_rank"]:
        assert m["peak_rss_bytes"] >= m["baseline_rss_bytes"] > 0
    assert rec["memory"]["model_state_bytes_per_rank_theory"] == 16 * rec["model"]["params"]  # fp32 AdamW
    assert 0 < rec["mfu"] <= 1 and rec["flops"]["hfu"] == rec["mfu"] and rec["flops"]["peak_dtype"] == "fp32"
    assert rec["gpu"]["available"] is False and rec["gpu"]["reason"] == "cpu run"   # no NVML on CPU
    assert rec["framework"]["native_config"]["mixed_precision"] == "none (fp32)"
    assert rec["framework"]["precision_recipe"] == {"params": "fp32", "compute": "fp32", "master_weights": None,
                                                    "loss_scaling": None, "grad_reduce": "fp32"}
    assert rec["framework"]["optimizer_impl"] == "for_loop"        # torch's default on CPU
    assert all(m["setup_peak_rss_bytes"] <= m["peak_rss_bytes"] for m in rec["memory"]["per_rank"])
    assert rec["env"]["backend"] == "gloo" and rec["env"]["threads_per_rank"] >= 1
    assert rec["framework"]["native_config"]["gradient_as_bucket_view"] is True
    assert len(rec["convergence"]["train_loss"]) == t["warmup_steps"] + steps
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == t["warmup_steps"] + steps and json.loads(lines[-1])["phase"] == "measure"
    if nproc == 2:
        bucket_bytes = sum(rec["framework"]["native_config"]["bucket_sizes_bytes"])
        assert bucket_bytes == 4 * rec["model"]["params"]          # every fp32 grad, once
        # the buckets DDP rebuilt after step 1 (in use since), the construction-time ones beside them
        native = rec["framework"]["native_config"]
        assert native["buckets_rebuilt"] is True and sum(native["bucket_sizes_bytes_at_construction"]) == bucket_bytes
        assert rec["comm"]["per_step_bytes"]["all_reduce"] == bucket_bytes
        assert rec["comm"]["source"] == "c10d_dispatch"
        assert rec["comm"]["wire_bytes_per_rank"] == pytest.approx(rec["comm"]["analytic_wire_bytes_per_rank"])
        assert len(json.loads(lines[-1])["per_rank_step_time_s"]) == 2
        ct = rec["comm"]["time"]["kinds"]["all_reduce"]     # the profiled steps: comm time
        assert ct["count"] >= 1 and ct["time_s"] > 0 and ct["busbw_Bps"] > 0
        assert ct["overlapped_s"] + ct["exposed_s"] == pytest.approx(ct["time_s"])
        assert 0 <= rec["comm"]["time"]["exposed_fraction"] <= 1
        # run.comm_profile_repeats (3) periods, their mean the figure, their spread kept around it
        fastest, median, slowest = ct["time_s_spread"]
        assert rec["comm"]["time"]["periods"] == 3 and fastest <= median <= slowest
        assert fastest <= ct["time_s"] * (1 + 1e-9) and ct["time_s"] <= slowest * (1 + 1e-9)
    assert "samples/s" in proc.stdout and "result:" in proc.stdout


def _losses(rec):
    return [l for _, l in rec["convergence"]["train_loss"]]


def test_throughput_is_unbiased_when_step_boundaries_drift(run_dir):
    """Rank 1 sleeps a random 0-20 ms at the end of every step, after the all-reduce, so the
    ranks' step boundaries drift. The throughput must still match the window's wall time read
    from the clock (max end - min start over ranks) within 1%; the sum of per-step maxima (the
    estimator before) over-counts it."""
    proc, rec = run_record(run_dir, "framework=ddp", "launcher.nproc=2", "debug=fault_jitter",
                           "run.warmup_steps=2", "run.measure_steps=60", "run.global_batch=2",
                           "fault.step=2")   # jitter from the first measured step on
    assert rec["status"] == "ok", rec["error"]
    t = rec["timing"]
    starts, ends = zip(*t["per_rank_window_unix_s"])
    wall = max(ends) - min(starts)
    estimated = 2 * 60 / rec["throughput"]["samples_per_s"]
    per_step_max = sum(t["series_s"])
    print(f"window wall {wall:.4f} s, estimator {estimated:.4f} s, sum of per-step maxima {per_step_max:.4f} s")
    assert estimated == pytest.approx(wall, rel=0.01)
    assert per_step_max > 1.01 * wall   # small steps (global batch 2): the jitter dominates


def test_equivalence_ddp2_matches_single_process(tmp_path):
    """DDP at 2 ranks x micro-batch B/2 == 1 rank x B, 10 steps, fp32, rel 1e-5."""
    steps = ("run.warmup_steps=2", "run.measure_steps=8", "run.global_batch=8")
    _, one = run_record(tmp_path / "n1", "launcher.nproc=1", *steps)
    _, two = run_record(tmp_path / "n2", "launcher.nproc=2", *steps)
    _, accum = run_record(tmp_path / "acc", "launcher.nproc=2", "run.micro_batch=2", *steps)
    assert two["parallel"]["micro_batch"] == 4 and accum["parallel"]["grad_accum"] == 2
    ref = _losses(one)
    assert len(ref) == 10 and ref[-1] < ref[0]  # it trains
    for other in (two, accum):
        assert _losses(other) == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("hook", ["ddp_fp16_hook", "ddp_bf16_hook", "ddp_powersgd"])
def test_comm_hooks_run_and_count_bytes(run_dir, hook):
    proc, rec = run_record(run_dir, f"framework={hook}", "launcher.nproc=2", "run.warmup_steps=2",
                           "run.measure_steps=2")
    assert rec["status"] == "ok", rec["error"]
    sent = rec["comm"]["per_step_bytes"]["all_reduce"]
    fp32_bytes = 4 * rec["model"]["params"]
    if hook == "ddp_powersgd":
        assert rec["framework"]["native_config"]["forced_single_bucket"]
        assert len(rec["framework"]["native_config"]["bucket_sizes_bytes"]) == 1
        assert 0 < sent < fp32_bytes / 2  # low-rank P, Q plus uncompressed vectors
    else:
        assert sent == fp32_bytes / 2     # 16-bit on the wire


def test_vision_model_runs(run_dir):
    proc, rec = run_record(run_dir, "model=resnet18_tiny", "launcher.nproc=2", *FAST)
    assert rec["status"] == "ok", rec["error"]
    assert rec["throughput"]["tokens_per_s"] is None and rec["model"]["kind"] == "vision"


def test_killed_rank_fails_fast(run_dir):
    """The run ends because of the death (the agent notices it), not because rank 0 waited out
    its collective timeout (run.pg_timeout_s=60 would make it a `timeout`); run_record also
    checks that no process outlived the run."""
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fault_kill", "run.pg_timeout_s=60")
    assert rec["status"] == "failed" and proc.returncode == 1
    assert rec["error"]["rank"] == 1 and rec["error"]["signal"] == "SIGKILL"
    assert rec["error"]["message"] == "rank 1 was killed by SIGKILL (exit code -9)"
    assert "timed out" not in json.dumps(rec["error"]).lower()
    fired = (run_dir / "fault_fired").stat().st_mtime
    assert (run_dir / "result.json").stat().st_mtime - fired < rec["config"]["run"]["pg_timeout_s"]
    assert check_record(rec) == []


def test_a_process_group_that_does_not_form_is_started_again(run_dir):
    """Rank 1 sleeps before it joins the process group, in the first launch attempt only (a
    rendezvous hang): after run.form_timeout_s the launcher kills every rank, starts them again,
    and the run ends ok with a warning that names where each rank was; two launches in the
    timeline, every rank joined in the second."""
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fast", "fault.kind=hang_at_start", "fault.rank=1",
                           "fault.seconds=3600", "run.form_timeout_s=5")
    assert rec["status"] == "ok", rec["error"]
    warning = next(w for w in rec["warnings"] if w.startswith("launch attempt 1:"))
    assert "did not form their process group within run.form_timeout_s=5 s" in warning
    assert "rank 1: faults.py" in warning and "before_process_group" in warning, warning
    assert "the measurement is from attempt 2" in warning
    evts = events.read(run_dir)
    assert [e["attempt"] for e in evts if e["event"] == "launch"] == [1, 2]
    assert formed(evts, 2) and len([e for e in evts if e["event"] == "process_group"]) == 2
    # without retries the run waits for its own timeout, as before
    proc, rec = run_record(run_dir.with_name("no_retry"), "launcher.nproc=2", "debug=fast", "fault.kind=hang_at_start",
                           "fault.rank=1", "fault.seconds=3600", "run.form_retries=0", "run.timeout_s=8")
    assert rec["status"] == "timeout" and not any(w.startswith("launch attempt") for w in rec["warnings"])


def test_formed_counts_the_latest_launch_only():
    evts = [{"event": "launch", "rank": None}, {"event": "process_group", "rank": 0},
            {"event": "launch", "rank": None}, {"event": "process_group", "rank": 1}]
    assert not formed(evts, 2) and formed(evts + [{"event": "process_group", "rank": 0}], 2)
    assert formed([{"event": "process_group", "rank": 0}], 1)     # no launch mark: all events count


def test_raising_rank_reports_its_traceback(run_dir):
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fault_raise")
    assert rec["status"] == "failed"
    assert rec["error"]["rank"] == 1
    assert "injected fault at step 2" in rec["error"]["message"]
    assert "faults.py" in rec["error"]["traceback"]


def test_slow_rank_is_named_as_straggler_in_result_and_report(run_dir):
    """Rank 1 sleeps 0.2 s before every step from step 2 (debug=fault_sleep): every rank's step
    time grows, and the result and the report name rank 1 from its late arrival."""
    from conftest import bench
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fault_sleep")
    assert rec["status"] == "ok", rec.get("error")
    st = rec["stragglers"]
    assert st["flagged"] == [1]
    assert 0.18 < st["late_median_s"][1] < 0.4 and st["late_median_s"][0] == 0
    assert min(rec["timing"]["per_rank_median_s"]) > 0.2          # both ranks' steps show the delay
    assert any(w.startswith("straggler: rank 1 ") for w in rec["warnings"])
    out = bench("report", str(run_dir), "-o", str(run_dir / "rep"))
    assert out.returncode == 0, out.stderr[-2000:]
    html = (run_dir / "rep" / "report.html").read_text()
    assert "<h2>Stragglers</h2>" in html and "status-bad\">1</td>" in html
    assert "## Stragglers" in (run_dir / "rep" / "report.md").read_text()
    assert "stragglers" in (run_dir / "rep" / "summary.csv").read_text().splitlines()[0]


def test_hang_becomes_timeout_via_collective_timeout(run_dir):
    """A rank stuck outside a collective: its peer's collective times out (run.pg_timeout_s),
    long before the wall-clock bound (run.timeout_s, whose message would name it)."""
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fault_hang", "run.pg_timeout_s=5")
    assert rec["status"] == "timeout", rec["error"]
    assert "run.timeout_s" not in rec["error"]["message"]
    assert "timed out" in (rec["error"]["message"] + (rec["error"].get("traceback") or "")).lower()


def test_wall_clock_timeout_kills_everything(run_dir):
    """Nothing else ends this run (collective timeout 600 s): the launcher's wall clock does,
    and it kills every rank (run_record fails on any process left behind)."""
    proc, rec = run_record(run_dir, "launcher.nproc=2", "debug=fault_hang", "run.timeout_s=8",
                           "run.pg_timeout_s=600")
    assert rec["status"] == "timeout"
    assert "run.timeout_s=8" in rec["error"]["message"]
    # where each rank was, from its own stack dump: the hung rank in the fault's sleep, its
    # peer inside the runner (blocked in the next collective)
    stacks = rec["error"]["stacks"]
    assert set(stacks) == {"0", "1"}, stacks
    assert "faults.py" in stacks["1"] and "runner.py" in stacks["1"], stacks["1"]
    assert "faults.py" not in stacks["0"] and "runner.py" in stacks["0"], stacks["0"]
    assert (run_dir / "stacks" / "rank1.txt").read_text().count("File ") > stacks["1"].count("File ")
    # ... and the message itself says so in one line per rank (what a CI log shows first)
    msg = rec["error"]["message"]
    assert re.search(r"rank 0: \S+:\d+ \w+ <- ddlbench/\S+:\d+ \w+", msg), msg
    assert re.search(r"rank 1: faults\.py:\d+ \w+", msg), msg


def test_sigusr1_stops_cleanly_with_partial_measurements(run_dir):
    """Slurm's time-limit warning (SIGUSR1) reaches every rank through the launcher (torch
    elastic does not forward it); the run ends as `timeout` with the steps it measured."""
    import signal
    import subprocess

    from conftest import REPO
    proc = subprocess.Popen([str(REPO / ".venv/bin/bench"), "run", "debug=fast", "launcher.nproc=2", "logger=none",
                             "run.measure_steps=100000", *HOLD_AT_STEP_3, f"run.dir={run_dir}"], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until_held(run_dir)       # handlers installed, two measured steps done (rank 1 waits for rank 0)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)     # bounds a hang; the stop itself takes ~1 s
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "timeout" and rec["error"]["signal"] == "SIGUSR1", rec["error"]
    assert "stopped by SIGUSR1" in rec["error"]["message"]
    part = rec["partial"]
    assert part["ranks_reporting"] == 2 and part["measured_steps"] >= 1
    assert rec["throughput"]["samples_per_s"] > 0 and len(rec["timing"]["series_s"]) == part["measured_steps"]
    assert len(rec["convergence"]["train_loss"]) == part["steps_completed"]
    # forked agent and ranks keep the launcher's command line, so this finds them too
    leftover = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout
    assert not leftover, leftover


def test_sigterm_to_the_launcher_kills_the_ranks_and_leaves_a_result(run_dir):
    """`kill PID` or scancel's SIGTERM reaches only the launcher (its ranks live in the agent's
    own session): it must end them and still leave exactly one result."""
    import signal

    from conftest import bench_background
    proc = bench_background("run", "debug=fast", "launcher.nproc=2", "logger=none", "run.progress=false",
                            "run.measure_steps=100000", f"run.dir={run_dir}")
    wait_until_training(run_dir, ranks=2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "failed" and rec["error"]["type"] == "terminated"
    assert rec["error"]["signal"] == "SIGTERM" and check_record(rec) == []
    proc.assert_nothing_left()
