"""The longest context a layout fits (`bench context`, ddlbench/project/context.py): the search by
hand, then for llama_tiny on an emulated 0.08 GiB device (run.device_memory_gb, enforced on a CPU
by the memory tracker): the estimator's answer, the run at it ends ok and the one past it ends
oom cleanly, and `bench report` over those runs plots tokens/s and memory against the length."""
from __future__ import annotations

import json

import pytest
from conftest import bench, for_runs

from ddlbench.project.context import candidates, longest


def test_the_search_by_hand():
    assert candidates(128, None) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert candidates(128, [1024, 256, 256]) == [256, 1024]
    assert longest([(128, 10), (256, 20), (512, 40), (1024, 80)], 50) == 512
    assert longest([(128, 60), (256, 120)], 50) is None
    # a length that cannot be planned ends the search: nothing longer is claimed
    assert longest([(128, 10), (256, None), (512, 20)], 50) == 128


def test_llama_tiny_on_a_small_device_fits_512_tokens_and_1024_ends_oom(tmp_path):
    out = tmp_path / "ctx"
    proc = bench("context", "model=llama_tiny", "framework=ddp", "launcher.nproc=1", "run.global_batch=2",
                 "run.warmup_steps=1", "run.measure_steps=2", "run.device_memory_gb=0.08",
                 "seq_lens=[128,256,512,1024]", f"out={out}", timeout=for_runs(4))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "context.json").read_text())
    assert doc["longest_seq_len"] == 512 and doc["device_memory_source"] == "run.device_memory_gb"
    est = {r["seq_len"]: r["estimate_bytes"] for r in doc["estimates"]}
    assert est[128] < est[256] < est[512] <= 0.08 * 2**30 < est[1024]
    at, past = doc["measured"]
    assert (at["seq_len"], at["status"], past["seq_len"], past["status"]) == (512, "ok", 1024, "oom")
    # the estimate at the boundary against the tracker's peak (docs/memory-check.md: within 10%)
    assert at["peak_bytes"] == pytest.approx(est[512], rel=0.10)
    assert "out of memory on the emulated device" in past["error"]
    assert "longest sequence that fits (estimate): 512" in proc.stdout and (out / "context.png").stat().st_size > 0
    rec = json.loads((out / "runs" / "seq_1024" / "result.json").read_text())
    assert rec["status"] == "oom" and "OutOfMemoryError" in rec["error"]["message"]

    rep = bench("report", str(out / "runs"), "-o", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert (tmp_path / "report" / "context.png").is_file()
    assert "Throughput and memory against sequence length" not in rep.stderr
    assert "context.png" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("args,message", [
    (("model=llama_tiny", "framework=ddp", "model.seq_len=256"), "sets model.seq_len itself"),
    (("model=resnet18_tiny", "framework=ddp"), "has no sequence"),
    (("framework=ddp",), "model= is required"),
    (("model=llama_tiny", "framework=ddp", "seq_lens=[a]"), "seq_lens"),
    # issue 66 (8): 1e10 tokens tried to build an 80 GB example batch
    (("model=llama_tiny", "framework=ddp", "seq_lens=[10000000000]"), "exceed 4,194,304 tokens"),
    # issue 66 (10): a file where the output directory goes, said before the work
    (("model=llama_tiny", "framework=ddp", "out={tmp}/a_file"), "exists and is not a directory"),
])
def test_bad_input_is_refused_with_the_reason(args, message, tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    args = [a.format(tmp=tmp_path) for a in args]
    out = [] if any(a.startswith("out=") for a in args) else [f"out={tmp_path}"]
    proc = bench("context", *args, "measure=false", *out)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_stop_signal_stops_the_run_it_measures_and_nothing_writes_after(tmp_path):
    """Issue 66 (6): SIGTERM to `bench context` while it measured left the run's agent and rank
    training under pid 1 (subprocess.run SIGKILLs its direct child only); they wrote an ok result
    21 s after `bench context` exited. The run is stopped through its launcher and waited for."""
    import signal
    import time

    from conftest import HOLD_AT_STEP_3, bench_background, wait_until_held
    out = tmp_path / "ctx"
    proc = bench_background("context", "model=llama_tiny", "framework=ddp", "launcher.nproc=1", "run.global_batch=2",
                            "run.device_memory_gb=1", "seq_lens=[128]", *HOLD_AT_STEP_3, f"out={out}")
    try:
        run_dir = out / "runs" / "seq_128"
        wait_until_held(run_dir)             # the measured run holds at step 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 128 + signal.SIGTERM
    finally:
        proc.assert_nothing_left()           # no agent, no rank outlived it
    err = proc.completed().stderr
    assert "the run at seq_len 128: SIGTERM received; stopping it" in err and "Traceback" not in err, err[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "failed" and rec["error"]["signal"] == "SIGTERM"
    files = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    time.sleep(2)
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == files   # no late write
    assert not (out / "context.json").exists()
