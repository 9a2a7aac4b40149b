"""W&B is a view of result.json: offline by default, and never able to fail or stall a run."""
import time

from conftest import run_record

FAST = ("run.warmup_steps=1", "run.measure_steps=2")


def test_offline_run_directory_holds_the_run(run_dir):
    proc, rec = run_record(run_dir, *FAST, "logger=wandb")  # later override wins over logger=none
    assert proc.returncode == 0 and rec["status"] == "ok"
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, proc.stdout + proc.stderr
    data = next(runs[0].glob("run-*.wandb")).read_bytes()
    # the record log carries the config, the per-step metrics and the summary
    for needle in (b"gpt2_tiny", b"step_time_s", b"throughput/samples_per_s", b"step_time/median(s)"):
        assert needle in data, needle
    assert "W&B (offline)" in proc.stdout


def test_unreachable_online_wandb_is_only_a_warning(run_dir):
    t0 = time.monotonic()
    proc, rec = run_record(run_dir, *FAST, "logger=wandb", "logger.mode=online", "logger.init_timeout_s=5")
    assert rec["status"] == "ok" and proc.returncode == 0
    assert "warning: W&B logging" in proc.stderr
    assert time.monotonic() - t0 < 120
