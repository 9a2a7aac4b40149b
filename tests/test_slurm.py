"""Sweeps through a real single-node Slurm (scripts/slurm_local.sh: munged, MariaDB, slurmdbd,
slurmctld, slurmd on localhost) and `launcher=slurm` under srun."""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    HOLD_AT_STEP_3,
    REPO,
    Bounded,
    bench,
    run_bounded,
    scaled,
    wait_for,
    wait_until_held,
    wait_until_training,
)

from ddlbench.sweep import manifest, status
from ddlbench.sweep.commands import _queued_ids

pytestmark = pytest.mark.slow
SCRIPT = REPO / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def slurm():
    was_up = subprocess.run(["pgrep", "--ns", str(os.getpid()), "--nslist", "mnt", "-x", "slurmctld"],
                            capture_output=True).returncode == 0        # this machine's, not an emulated cluster's
    proc = run_bounded(["bash", str(SCRIPT), "start"], 240, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield
    if not was_up:  # stop only what this test started
        run_bounded(["bash", str(SCRIPT), "stop"], 60)


def wait_done(sweep: Path, per_cell_s: float = 120) -> dict:
    """Poll like a user would (status from result files + squeue) until no cell is queued. Each
    cell is a run of its own: the bound is per cell (scaled), the test's alarm re-armed for it."""
    bound = scaled(per_cell_s) * len(manifest.read(sweep))
    with Bounded(bound):
        end = time.monotonic() + bound
        while time.monotonic() < end:
            rows = status.cell_states(sweep, _queued_ids(sweep, manifest.meta(sweep)))
            if all(r["state"] not in ("running", "missing") for r in rows):
                return {r["index"]: r["state"] for r in rows}
            time.sleep(2)
    raise TimeoutError(status.render(rows))


def test_job_array_sweep_status_and_resume(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    proc = bench("sweep", "--backend", "slurm", "--dir", str(sweep), "framework=ddp,fsdp_full",
                 "launcher.nproc=1,2", "debug=fast")
    assert proc.returncode == 0, proc.stderr
    assert "submitted job array" in proc.stdout
    # non-blocking: it returned while the array's cells were still queued or running
    assert _queued_ids(sweep, manifest.meta(sweep)), "bench sweep returned only after its cells ended"
    assert wait_done(sweep) == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}
    cells = manifest.read(sweep)
    for c in cells:
        rec = json.loads((sweep / c.id / "result.json").read_text())
        assert rec["status"] == "ok" and rec["config"]["run"]["dir"] == str(sweep / c.id)
    assert len(list((sweep / "logs").glob("*_*.out"))) == 4

    # resume after deleting one result reruns exactly that cell
    kept = {c.id: (sweep / c.id / "result.json").stat().st_mtime_ns for c in cells if c.index != 2}
    subprocess.run(["rm", "-rf", str(sweep / cells[2].id)], check=True)
    proc = bench("sweep", "resume", str(sweep))
    assert "resuming 1 of 4 cells" in proc.stdout, proc.stdout + proc.stderr
    assert wait_done(sweep) == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}
    assert {cid: (sweep / cid / "result.json").stat().st_mtime_ns for cid in kept} == kept
    # one array per cell shape (1 and 2 CPUs), then one for the resumed cell
    assert len(json.loads((sweep / "sweep.json").read_text())["jobs"]) == 3


def test_a_failing_cell_is_recorded_and_the_rest_succeed(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    proc = bench("sweep", "--backend", "slurm", "--dir", str(sweep), "launcher.nproc=2",
                 "debug=fast,fault_raise", "logger=none")
    assert proc.returncode == 0, proc.stderr
    states = wait_done(sweep)
    assert sorted(states.values()) == ["failed", "ok"]
    rows = status.cell_states(sweep)
    failed = next(r for r in rows if r["state"] == "failed")
    assert "injected fault" in failed["reason"] and "fault_raise" in failed["overrides"]


def test_a_cancelled_cell_shows_slurms_state_from_sacct(slurm, tmp_path):
    """scancel ends the task: the launcher turns the SIGTERM into a `terminated` result, and
    status shows Slurm's own state from the accounting database (slurmdbd + MariaDB); resume
    would run the cell again."""
    sweep = tmp_path / "sweep"
    proc = bench("sweep", "--backend", "slurm", "--dir", str(sweep), "framework=ddp", "launcher.nproc=1",
                 "debug=fast", "logger=none", "run.measure_steps=100000", "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = manifest.meta(sweep)["jobs"][0]
    wait_until_training(sweep / manifest.read(sweep)[0].id, ranks=1)
    subprocess.run(["timeout", "10", "scancel", f"{job}_0"], check=True)
    wait_for(lambda: "cancelled" in bench("sweep", "status", str(sweep)).stdout, 60, "sacct to say cancelled", 1)
    out = bench("sweep", "status", str(sweep)).stdout
    assert "1 cells: 1 cancelled" in out and f"Slurm job {job}_0: CANCELLED" in out, out
    # scancel's SIGTERM reached the launcher, which killed its ranks and still left a result (sacct
    # may say CANCELLED a moment before the launcher has written it)
    result = sweep / manifest.read(sweep)[0].id / "result.json"
    wait_for(result.exists, 30, "the launcher to write the terminated result")
    rec = json.loads(result.read_text())
    assert rec["status"] == "failed" and rec["error"]["type"] == "terminated", rec["error"]
    left = subprocess.run(["pgrep", "-f", str(sweep)], capture_output=True, text=True).stdout.split()
    shown = {p: subprocess.run(["ps", "-o", "pid,ppid,pgid,sid,stat,etime,args", "-p", p], capture_output=True,
                               text=True).stdout for p in left}
    assert not left, shown   # no orphan ranks


@pytest.mark.timeout(600)
def test_time_limit_warning_stops_cleanly_and_requeue_reruns_the_cell(slurm, tmp_path):
    """The array template asks for SIGUSR1 before the limit (sent here by hand): the long cell
    ends as `timeout` with partial measurements. `scontrol requeue` of the other (failed) cell
    reruns it: the earlier attempt is archived, the new result records the restart count, and
    there is still one result per cell."""
    sweep = tmp_path / "sweep"
    proc = bench("sweep", "--backend", "slurm", "--dir", str(sweep), "framework=ddp", "launcher.nproc=1",
                 "debug=fast", "logger=none", "run.measure_steps=3000", "fault.kind=hang,raise", "fault.step=3",
                 "fault.seconds=900")
    assert proc.returncode == 0, proc.stderr[-2000:]
    job, cells = manifest.meta(sweep)["jobs"][0], manifest.read(sweep)
    long_result, short_result = (sweep / c.id / "result.json" for c in cells)
    # the long cell holds at step 3 (the hang fault), two measured steps behind it: a fixed wait found
    # none on a loaded machine; the other cell raises at step 3
    wait_until_held(sweep / cells[0].id)
    subprocess.run(["timeout", "10", "scancel", "--batch", "--signal=USR1", f"{job}_0"], check=True)
    assert wait_done(sweep) == {0: "timeout", 1: "failed"}
    first = json.loads(long_result.read_text())
    assert first["error"]["signal"] == "SIGUSR1" and first["partial"]["measured_steps"] >= 1, first["error"]
    assert first["throughput"]["samples_per_s"] > 0

    subprocess.run(["timeout", "10", "scontrol", "requeue", f"{job}_1"], check=True)

    def restarted() -> bool:
        rec = json.loads(short_result.read_text()) if short_result.exists() else {}
        return rec.get("env", {}).get("env_vars", {}).get("SLURM_RESTART_COUNT") == "1"
    wait_for(restarted, 240, "the requeued cell's result", 1)
    rec = json.loads(short_result.read_text())
    assert rec["status"] == "failed" and "injected fault" in rec["error"]["message"]
    assert [p.name for p in (sweep / ".attempts" / cells[1].id).iterdir()] == ["1"]
    assert len(list(sweep.glob("*/result.json"))) == 2


def test_launcher_slurm_trains_ddp_under_srun(slurm, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(["timeout", "270", "srun", "--ntasks=2", "--kill-on-bad-exit=1", str(REPO / ".venv/bin/bench"),
                           "run", "launcher=slurm", "debug=fast", f"run.dir={run_dir}"],
                          capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok" and rec["parallel"]["world_size"] == 2
    assert rec["config"]["launcher"]["name"] == "slurm" and len(rec["memory"]["per_rank"]) == 2


def test_launcher_slurm_refuses_an_unsupported_combination_before_training(slurm, tmp_path):
    """As the local launcher does: FairScale in bf16 is `unsupported`, with the reason, not an
    ImportError or a silent fp32 run."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(["timeout", "120", "srun", "--ntasks=2", "--kill-on-bad-exit=1", str(REPO / ".venv/bin/bench"),
                           "run", "launcher=slurm", "launcher.nproc=2", "framework=fairscale_oss", "run.precision=bf16",
                           "debug=fast", f"run.dir={run_dir}"],
                          capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "unsupported" and "fp32 only" in rec["error"]["message"], proc.stderr[-2000:]
    assert proc.returncode != 0 and not (run_dir / "logs").exists()


def test_time_limit_warning_under_srun_writes_a_timeout_result(slurm, tmp_path):
    """launcher=slurm (`#SBATCH --signal=USR1@120`, no B:, reaches every task): each rank saves
    its series, rank 0 gathers them and writes the `timeout` result with partial measurements."""
    run_dir, name = tmp_path / "run", f"usr1-{tmp_path.name}"
    proc = subprocess.Popen(["timeout", "270", "srun", "--ntasks=2", "--kill-on-bad-exit=1", f"--job-name={name}",
                             str(REPO / ".venv/bin/bench"), "run", "launcher=slurm", "debug=fast",
                             "run.measure_steps=100000", *HOLD_AT_STEP_3, f"run.dir={run_dir}"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until_held(run_dir)
    assert proc.poll() is None, proc.communicate()
    job = subprocess.run(["squeue", "-h", "-o", "%i", "-n", name], capture_output=True, text=True).stdout.split()
    assert len(job) == 1, job
    subprocess.run(["timeout", "10", "scancel", "--signal=USR1", job[0]], check=True)
    out, err = proc.communicate(timeout=90)
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "timeout" and rec["error"]["signal"] == "SIGUSR1", (out[-1000:], err[-2000:])
    assert rec["partial"]["ranks_reporting"] == 2 and rec["partial"]["measured_steps"] >= 1
    assert rec["throughput"]["samples_per_s"] > 0
    # the stop came from the signal, not from a limit: srun ended well inside its 300 s bound
    assert "stopped by SIGUSR1" in rec["error"]["message"]


def test_horovod_under_srun_without_horovodrun(slurm, tmp_path):
    """srun starts the ranks; bench serves Horovod's gloo rendezvous from rank 0."""
    pytest.importorskip("horovod.torch")
    run_dir = tmp_path / "run"
    proc = subprocess.run(["timeout", "270", "srun", "--ntasks=2", "--kill-on-bad-exit=1", str(REPO / ".venv/bin/bench"),
                           "run", "launcher=slurm", "framework=horovod", "debug=fast", "logger=none", f"run.dir={run_dir}"],
                          capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok" and rec["parallel"]["world_size"] == 2
    assert rec["comm"]["source"] == "adapter" and rec["comm"]["per_step_calls"]["all_reduce"] >= 1


def test_hydra_submitit_launcher_runs_a_multirun_as_one_job_array(slurm, tmp_path):
    proc = subprocess.run(
        ["timeout", "270", str(REPO / ".venv/bin/python"), "-m", "ddlbench.launch.hydra_app", "-m",
         "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=2",
         "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={tmp_path / 'multirun'}",
         "launcher.nproc=1,2", "debug=fast"],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = sorted((tmp_path / "multirun").rglob("result.json"))
    assert len(results) == 2
    recs = [json.loads(p.read_text()) for p in results]
    assert [r["status"] for r in recs] == ["ok", "ok"]
    assert sorted(r["parallel"]["world_size"] for r in recs) == [1, 2]


def test_advise_on_slurm_calibrates_then_measures_through_resume(slurm, tmp_path):
    """backend=slurm: each phase is a job array and `bench advise` returns at once; `resume`
    moves to the next phase once the array has finished."""
    out = tmp_path / "adv"
    proc = bench("advise", "model=gpt2_tiny", "devices=2", "frameworks=ddp,fsdp_full", "micro_batches=[4]",
                 "budget_runs=1", "backend=slurm", f"dir={out}", "run.warmup_steps=1", "run.measure_steps=3",
                 "logger=none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "submitted job array" in proc.stdout and "calibration not finished" in proc.stdout
    state = json.loads((out / "advice.json").read_text())
    assert state["phase"] == "calibrate"
    # DDP at micro-batch 4 (the compute line) and FSDP2 once (its factor over DDP)
    assert [(c["framework"], c["micro_batch"]) for c in state["calibration"]["cells"]] == [("ddp", 4), ("fsdp_full", 4)]
    assert all(c["cost_model"]["traffic"] == [] for c in state["calibration"]["cells"])     # 1 rank: nothing sent
    assert wait_done(out / "calibration") == {0: "ok", 1: "ok"}
    proc = bench("advise", "resume", str(out))
    assert proc.returncode == 0 and "measure not finished" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert wait_done(out / "measure") == {0: "ok"}
    proc = bench("advise", "resume", str(out))
    state = json.loads((out / "advice.json").read_text())
    measured = [c for c in state["candidates"] if c.get("measured")]
    assert [(c["rank"], c["measured"]["status"]) for c in measured] == [(1, "ok")]
    assert state["phase"] == "done" and f"recommendation: {measured[0]['label']}" in proc.stdout, proc.stdout
