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
])
def test_bad_input_is_refused_with_the_reason(args, message, tmp_path):
    proc = bench("context", *args, "measure=false", f"out={tmp_path}")
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
