"""Recovery from a failure (issue 67): the record's `recovery` arithmetic by hand
(ddlbench/metrics/recovery.py), the save a restart resumes from, and what is refused. The run that
recovers from a killed rank is in tests/test_checkpoints.py (beside the uninterrupted run it is held to)."""
from __future__ import annotations

import pytest

from ddlbench.metrics.recovery import recovery, recovery_warning
from ddlbench.planning.config import plan_from_overrides

T0 = 1000.0


def _ev(event, t, rank=None, **info):
    return {"event": event, "rank": rank, "t": T0 + t, **info}


# the first attempt: two ranks, a fault on rank 1 at step 8; the agent sees it 0.3 s later; the second
# attempt's ranks start, join, build, load step_6 and take their first step
TIMELINE = [
    _ev("rank_start", 0.0, 0), _ev("rank_start", 0.1, 1), _ev("first_step", 1.0, 0), _ev("first_step", 1.0, 1),
    _ev("fault", 5.0, 1, step=8, kind="kill"),
    _ev("failure_detected", 5.3, attempt=0, state="failed"),
    _ev("rank_start", 5.5, 0, attempt=1), _ev("rank_start", 5.6, 1, attempt=1),
    _ev("process_group", 5.8, 0, attempt=1), _ev("process_group", 5.9, 1, attempt=1),
    _ev("model_ready", 6.4, 0, attempt=1), _ev("model_ready", 6.2, 1, attempt=1),
    _ev("restored", 7.0, 0, step=6, attempt=1), _ev("restored", 7.2, 1, step=6, attempt=1),
    _ev("first_step", 8.0, 0, attempt=1), _ev("first_step", 8.1, 1, attempt=1),
]


def test_recovery_phases_by_hand():
    # the new attempt's steps: 0.9 s (its first, warm-up), then 0.5 s each; 2 steps lost (8 - 6)
    got = recovery(TIMELINE, [0.9, 0.5, 0.5, 0.5])
    assert got["attempts"] == 2 and got["fault"] == {"rank": 1, "step": 8, "kind": "kill"}
    assert got["resumed_from_step"] == 6 and got["steps_lost"] == 2
    # each phase ends at its event on the slowest rank: 5.3-5.0, 5.6-5.3, 5.9-5.6, 6.4-5.9, 7.2-6.4
    for key, want in (("detect_s", 0.3), ("relaunch_s", 0.3), ("process_group_s", 0.3), ("model_build_s", 0.5),
                      ("restore_s", 0.8)):
        assert got[key] == pytest.approx(want), key
    # back at step 8 when the second of the redone steps ends: first step end 8.1 + 0.5 = 8.6; from 7.2
    assert got["redo_s"] == pytest.approx(1.4)
    assert got["lost_s"] == pytest.approx(3.6)       # 8.6 - 5.0, the phases' sum
    (warning,) = recovery_warning(got)
    assert "rank 1 failed (kill, injected) at step 8" in warning and "3.60 s lost" in warning


def test_recovery_without_a_save_or_an_agent():
    # no save before the fault: the attempt starts afresh (restore 0 s) and every step is lost
    fresh = [e for e in TIMELINE if e["event"] != "restored"]
    got = recovery(fresh, [0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert got["resumed_from_step"] == 0 and got["steps_lost"] == 8 and got["restore_s"] == 0.0
    assert got["redo_s"] == pytest.approx(8.1 + 7 * 0.5 - 6.4)
    # a timeline without the agent's failure_detected: the detection is inside relaunch_s, lost_s still whole
    requeued = [e for e in TIMELINE if e["event"] != "failure_detected"]
    got = recovery(requeued, [0.9, 0.5, 0.5])
    assert got["detect_s"] is None and got["relaunch_s"] == pytest.approx(0.6)
    assert got["lost_s"] == pytest.approx(3.6)
    # a run never restarted has no recovery
    assert recovery(TIMELINE[:5], [0.5]) is None and recovery_warning(None) == []


def test_a_restart_resumes_from_the_newest_save_that_was_finished(tmp_path):
    """rank 0 marks a save COMPLETE once every rank's part is durable; a save the failure cut short has
    no marker and is passed over for the one before it."""
    from ddlbench.rank.saves import COMPLETE, newest_complete
    assert newest_complete(tmp_path) is None
    for step, done in ((3, True), (5, True), (7, False)):
        (tmp_path / f"step_{step}").mkdir()
        if done:
            (tmp_path / f"step_{step}" / COMPLETE).write_text(f"step {step}\n")
    (tmp_path / "latest").write_text("step_7")      # DeepSpeed's tag file: not a save
    assert newest_complete(tmp_path) == tmp_path / "step_5"


def test_restarts_need_the_elastic_agent():
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="launcher.max_restarts=1: torch's elastic agent.*archived"):
        plan_from_overrides(["launcher=slurm", "launcher.max_restarts=1", "run.dir=/tmp/x"])
    plan = plan_from_overrides(["framework=horovod", "launcher.max_restarts=1"])
    assert "started by its own launcher (Horovodrun)" in plan.variant.unsupported_reason(plan.cfg, "cpu")
    plan = plan_from_overrides(["framework=ddp", "launcher.max_restarts=1"])
    assert plan.variant.unsupported_reason(plan.cfg, "cpu") is None


def test_torchft_keeps_training_through_a_lost_replica_group(tmp_path):
    """benchmarks/torchft_recovery.py with torchft's own lighthouse, on gloo (resnet18_tiny: its batch-norm
    statistics must come over too): replica group 1 SIGKILLed
    before step 8 and started again; group 0 never loses a committed step and trains on alone; the
    replacement heals from it (live recovery over HTTP, not from step 0) and, from its next step on, the
    two compute the same loss on the same data: the state was carried over exactly."""
    import json
    import subprocess
    import sys

    from conftest import REPO, run_bounded
    out = tmp_path / "tft"
    proc = run_bounded([sys.executable, "benchmarks/torchft_recovery.py", str(out), "--steps", "30", "--kill-at", "8",
                        "--batch", "2", "--model", "resnet18_tiny"], 300, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + (out / "replicas.log").read_text()[-3000:]
    got = json.loads((out / "summary.json").read_text())
    assert got["steps_lost"] == 0 and got["survivor_steps_alone"] >= 1 and got["killed_to_joined_s"] > 0
    assert got["healed_to_step"] >= 8 and got["stall_s"] > 0
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    loss: dict[int, dict] = {}
    for r in rows:
        loss.setdefault(r["step"], {})[r["pid"]] = r["loss"]
    rejoined = [s for s, by in loss.items() if len(by) == 2 and s > got["healed_to_step"] + 1]
    assert len(rejoined) >= 4 and all(len(set(loss[s].values())) == 1 for s in rejoined), {s: loss[s] for s in rejoined}
    assert "samples/s with both groups" in proc.stdout
