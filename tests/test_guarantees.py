"""docs/guarantees.md, the part about mix-ups, orphans, damaged files and bad numbers (issue 49):
one owner per run, sweep and advise directory; a stop signal ends everything a command started;
every reader survives a damaged file; only finite, well-typed numbers in; no silent fallback."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import HOLD_AT_STEP_3, bench, bench_background, wait_for, wait_until_held, wait_until_training

from ddlbench.errors import ConfigError
from ddlbench.lifecycle import ownership
from ddlbench.record.results import check_record

# ---------------------------------------------------------------- one owner per directory


def test_a_second_run_on_a_directory_in_use_is_refused_and_the_first_is_intact(tmp_path):
    """Two `bench run` into one run.dir, the second started while the first runs (a user's second
    terminal, two array tasks): the second is refused at once, naming the owner; the first trains
    its own config and writes its own result."""
    d = tmp_path / "run"
    first = bench_background("run", "debug=fast", "framework=ddp", "launcher.nproc=1", "run.measure_steps=100000",
                             "run.timeout_s=1200", *HOLD_AT_STEP_3, f"run.dir={d}")
    try:
        wait_until_held(d)          # two measured steps behind it, which the stop below must find
        owner = ownership.read_owner(d / "owner.lock")
        assert owner["pid"] == first.proc.pid and owner["command"] == "bench run"
        second = bench("run", "debug=fast", "framework=fsdp_full", "launcher.nproc=1", "logger=none", f"run.dir={d}")
        assert second.returncode == 2, second.stderr
        assert f"is in use by another bench run: pid {first.proc.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert json.loads((d / "config.json").read_text())["framework"]["name"] == "ddp"   # not overwritten
        first.send_signal(signal.SIGUSR1)      # end the first cleanly: a `timeout` result with its steps
        assert first.wait(timeout=60) == 1
    finally:
        first.assert_nothing_left()
    rec = json.loads((d / "result.json").read_text())
    assert rec["framework"]["name"] == "ddp" and rec["status"] == "timeout" and rec["partial"]["measured_steps"] >= 1
    assert ownership.read_owner(d / "owner.lock") == {}      # released at the end


def test_ownership_refuses_joins_and_reclaims(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    d = tmp_path / "dir"
    first = ownership.take(d, "bench run")
    with pytest.raises(ConfigError, match=rf"in use by another bench run: pid {os.getpid()} on host"):
        ownership.take(d, "bench run")      # another open file description: flock says no
    first.release()
    assert ownership.read_owner(d / "owner.lock") == {}
    with ownership.take(d, "sweep") as again:
        assert again.reclaimed is None
    # an owner that died without releasing (SIGKILL, a lost node) left its file: taken over, said so
    (d / "owner.lock").write_text(json.dumps({"pid": 999999, "host": "gone", "started": "then", "command": "sweep"}))
    taken = ownership.take(d, "sweep")
    assert taken.reclaimed["pid"] == 999999
    assert "was owned by pid 999999 on host gone" in capsys.readouterr().err
    taken.release()
    # launcher=slurm: the srun tasks of one step share the directory; another step is refused
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    task0 = ownership.take(d, "bench run")
    task1 = ownership.take(d, "bench run")
    assert task1.file is None and task1.token == task0.token
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    with pytest.raises(ConfigError, match="Slurm step 41.0"):
        ownership.take(d, "bench run")
    task0.release()


def test_a_rank_refuses_a_directory_that_is_not_its_launchers(tmp_path):
    d = tmp_path / "dir"
    with ownership.take(d, "bench run") as owner:
        ownership.check_token(d, {ownership.TOKEN_ENV: owner.token})
        with pytest.raises(RuntimeError, match="no longer this rank's launcher's"):
            ownership.check_token(d, {ownership.TOKEN_ENV: "another-launchers-token"})


def test_a_second_sweep_on_a_directory_in_use_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    first = bench_background("sweep", "--dir", str(sweep), "debug=fast", "launcher.nproc=1", "logger=none",
                             "run.measure_steps=100000", "run.timeout_s=200")
    try:
        wait_for(lambda: any(sweep.glob("*/events.jsonl")), 120, "the sweep's first cell to start", 0.2)
        for args in (("sweep", "resume", str(sweep)),
                     ("sweep", "--dir", str(sweep), "debug=fast", "logger=none")):
            proc = bench(*args)
            assert proc.returncode == 2 and "is in use by another sweep" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
    finally:
        first.assert_nothing_left()


# ---------------------------------------------------------------- a signal ends everything

@pytest.mark.parametrize("sig,ranks", [(signal.SIGTERM, 2), (signal.SIGINT, 1), (signal.SIGHUP, 1)],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_to_a_sweeps_pid_ends_its_cell_and_nothing_writes_after(tmp_path, sig, ranks):
    """`kill -TERM <pid of bench run -m>` (scancel, a CI timeout), Ctrl-C, a closed terminal: the
    running cell's launcher, agent and ranks end before the sweep does; the cell's result says why
    (resume runs it again); nothing is written after the sweep exited; one line, no traceback."""
    parent = tmp_path / "multirun"
    proc = bench_background("run", "-m", "debug=fast", f"launcher.nproc={ranks}", "run.measure_steps=100000",
                            "run.timeout_s=200", f"run.dir={parent}")
    try:
        wait_for(lambda: any(parent.glob("*/events.jsonl")), 120, "the cell to start", 0.2)
        cell = next(parent.glob("*/events.jsonl")).parent
        wait_until_training(cell, ranks=ranks, steps_s=0.5)
        proc.send_signal(sig)
        assert proc.wait(timeout=90) == 128 + sig
    finally:
        proc.assert_nothing_left()        # no agent, rank or cell process outlived the sweep
    files = {p: p.stat().st_mtime_ns for p in cell.rglob("*") if p.is_file()}
    time.sleep(3)
    assert {p: p.stat().st_mtime_ns for p in cell.rglob("*") if p.is_file()} == files   # no late write
    rec = json.loads((cell / "result.json").read_text())
    assert rec["status"] == "failed" and check_record(rec) == []
    assert rec["error"]["type"] == ("interrupted" if sig == signal.SIGINT else "terminated")
    assert rec["error"]["signal"] == signal.Signals(sig).name
    err = proc.completed().stderr
    assert "Traceback" not in err, err
    assert f"bench: stopped by {signal.Signals(sig).name}" in err
    assert f"bench sweep resume {parent}" in err


# ---------------------------------------------------------------- damaged files

def _damaged_tree(root: Path) -> Path:
    """A sweep-like directory: one good result, one truncated, one not a record; a damaged manifest."""
    from reportdata import make_record, write
    write(root, make_record("good"))
    (root / "cut").mkdir()
    (root / "cut" / "result.json").write_text('{"schema": "ddlbench.result/1", "run_id": "cut", "sta')
    (root / "list").mkdir()
    (root / "list" / "result.json").write_text("[1, 2]")
    return root


def test_table_and_report_go_on_past_damaged_results(tmp_path):
    root = _damaged_tree(tmp_path / "runs")
    proc = bench("table", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "ddp" in proc.stdout and "gpt2_tiny" in proc.stdout          # the good row is printed
    assert f"{root / 'cut' / 'result.json'}: damaged result record (not valid JSON" in proc.stderr
    assert f"{root / 'list' / 'result.json'}: damaged result record (expected a JSON dict" in proc.stderr
    assert "Traceback" not in proc.stderr
    (root / "manifest.jsonl").write_text('{"index": 0, "id": "x", "overri\n')
    (root / "sweep.json").write_text('{"backend": "local"}')
    proc = bench("report", str(root), "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    assert "3 runs (2 not ok)" in proc.stdout
    assert "damaged sweep manifest (line 1: not valid JSON" in proc.stderr and "Traceback" not in proc.stderr


BAD_INPUT = [
    # (what to set up, the command, what its one line says)
    ("truncated", ["project", "{dir}/cut", "network=dgx_h100"], "damaged result record (not valid JSON"),
    ("truncated", ["project", "{dir}/good", "network=dgx_h100", "world_sizes=[8,3.5]"],
     "world_sizes must be a list of integers >= 1, got '3.5'"),
    ("truncated", ["project", "{dir}/good", "network=dgx_h100", "overlap=.nan"], "overlap must be a finite number"),
    ("truncated", ["project", "{dir}/good", "network=dgx_h100", "allocate=time", "budget_GBps=0"],
     "budget_GBps must be > 0, got 0"),
    ("truncated", ["project", "{dir}/good", "network={dir}/inf.yaml"], "dimension 'node' size must be a whole number >= 1, got inf"),
    ("truncated", ["project", "{dir}/good", "network={dir}/nan.yaml"], "bandwidth_GBps must be a finite number > 0, got nan"),
    # issue 66 (1): another model's step priced this run; (10): out= a file, said before any work
    ("compute_from", ["project", "{dir}/two", "network=dgx_h100", "compute_from={dir}/llama"],
     "is not a 1-rank result of this run's configuration: its model is llama_tiny"),
    ("compute_from", ["project", "{dir}/two", "network=dgx_h100", "compute_from={dir}/two"], "it ran on 2 ranks"),
    ("compute_from", ["project", "{dir}/two", "network=dgx_h100", "out={dir}/a_file"], "exists and is not a directory"),
    ("compute_from", ["project", "{dir}/bad_group", "network=dgx_h100"], "communication group '0,1@1' is not <ranks>@<nodes>"),
    ("compute_from", ["project", "{dir}/two", "network=dgx_h100", f"world_sizes=[{','.join(map(str, range(2, 72)))}]"],
     "at most 64 world_sizes, got 70"),
    # issue 66 (4): a user's directory was written into; (10) a dangling symlink was a FileExistsError
    ("foreign", ["run", "run.dir={dir}/user", "debug=fast"],
     "holds files ddlbench did not write (config.json, config.yaml, events.jsonl, thesis.tex)"),
    ("foreign", ["run", "run.dir={dir}/link", "debug=fast"], "(a symlink to "),
    ("foreign", ["run", "run.dir={dir}/dangling", "debug=fast"], "which does not exist"),
    ("foreign", ["run", "run.dir={dir}/a_file", "debug=fast"], "exists and is not a directory"),
    ("manifest", ["sweep", "status", "{dir}"], "damaged sweep manifest (line 2: not valid JSON"),
    ("manifest", ["sweep", "resume", "{dir}"], "damaged sweep manifest (line 2: not valid JSON"),
    ("sweep_json", ["sweep", "status", "{dir}"], "damaged sweep description (not valid JSON"),
    ("sweep_json", ["sweep", "resume", "{dir}"], "damaged sweep description (not valid JSON"),
    ("advice_cut", ["advise", "resume", "{dir}"], "damaged advice (not valid JSON"),
    ("advice_phase", ["advise", "resume", "{dir}"], "phase must be one of calibrate, measure, done, got 'bogus'"),
    ("none", ["advise", "model=gpt2_tiny", "devices=2", "micro_batches=[0]", "dir={dir}/a"],
     "micro_batches must be a list of integers >= 1, got 0"),
    ("none", ["advise", "model=gpt2_tiny", "devices=2", "device_memory_gib=.inf", "dir={dir}/a"],
     "device_memory_gib must be a finite number"),
    ("none", ["advise", "model=gpt2_tiny", "devices=2", "network={dir}/inf.yaml", "dir={dir}/a"],
     "size must be a whole number >= 1, got inf"),
    ("none", ["commbench", "launcher.nproc=2", "sizes=[1e6]"], "sizes must be a list of integers >= 4"),
    ("none", ["report", "{dir}", "-o", "{dir}/a_file"], "exists and is not a directory"),
    ("none", ["run", "optim.lr=.nan", "run.dir={dir}/r"], "optim.lr"),
]


def _setup(kind: str, d: Path) -> None:
    from reportdata import make_record, write
    d.mkdir(parents=True, exist_ok=True)
    (d / "a_file").write_text("not a directory")
    for name, size, bw in (("inf", ".inf", "1"), ("nan", "8", ".nan")):
        (d / f"{name}.yaml").write_text(f"name: {name}\ndimensions:\n  - {{name: node, size: {size}, "
                                        f"bandwidth_GBps: {bw}, latency_us: 1}}\n")
    if kind == "truncated":
        write(d, make_record("good"))
        (d / "cut").mkdir()
        (d / "cut" / "result.json").write_text('{"schema": "ddlbench.result/1", "st')
    elif kind == "compute_from":
        two = make_record("two", world=2)
        two["comm"] = {"per_step_bytes": {"all_reduce": 4e6}, "per_step_bytes_by_group": {"all_reduce": {"2@1": 4e6}}}
        write(d, two)
        write(d, {**two, "run_id": "bad_group", "comm": {**two["comm"], "per_step_bytes_by_group": {"all_reduce": {"0,1@1": 4e6}}}})
        llama = make_record("llama")
        llama["model"]["name"] = "llama_tiny"
        write(d, llama)
    elif kind == "foreign":
        user = d / "user"
        user.mkdir()
        for name, text in (("config.json", '{"mine": 1}'), ("config.yaml", "mine: 1\n"), ("events.jsonl", "not json\n"),
                           ("thesis.tex", "\\documentclass{article}\n")):
            (user / name).write_text(text)
        (d / "link").symlink_to(user)
        (d / "dangling").symlink_to(d / "nowhere")
    elif kind in ("manifest", "sweep_json"):
        (d / "sweep.json").write_text('{"backend": "local", "jobs": []}' if kind == "manifest" else '{"backend": "lo')
        (d / "manifest.jsonl").write_text('{"index": 0, "id": "a", "overrides": [], "repeat": 0}\n{"index": 1, "i\n')
    elif kind == "advice_cut":
        (d / "advice.json").write_text('{"phase": "measure", "options": {"backend": "lo')
    elif kind == "advice_phase":
        (d / "advice.json").write_text(json.dumps({"phase": "bogus", "options": {"backend": "local"}}))


@pytest.mark.parametrize("kind,args,message", BAD_INPUT, ids=[" ".join(a[:3]) for _, a, _ in BAD_INPUT])
def test_bad_input_and_damaged_files_are_one_line_exit_2_never_a_traceback(tmp_path, kind, args, message):
    d = tmp_path / "d"
    _setup(kind, d)
    proc = bench(*[a.format(dir=d) for a in args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("bench: warning:")]
    assert len(lines) == 1, proc.stderr
    assert not list(d.rglob("projection.json")) and not (d / "a").exists()   # nothing written
    if kind == "foreign":      # the user's files as they were, nothing added
        user = d / "user"
        assert sorted(p.name for p in user.iterdir()) == ["config.json", "config.yaml", "events.jsonl", "thesis.tex"]
        assert (user / "config.json").read_text() == '{"mine": 1}' and not (d / "nowhere").exists()


# ---------------------------------------------------------------- what we write is strict JSON

def test_every_json_we_write_is_strict(tmp_path):
    from ddlbench.record.results import atomic_write_json
    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}")) == \
        {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_mean_over_ranks_takes_null_losses_as_missing():
    from ddlbench.metrics.timing import mean_ignoring_missing
    assert mean_ignoring_missing([None, 2.0, float("nan"), 4.0]) == 3.0


# ---------------------------------------------------------------- no silent fallbacks

def test_micro_batch_auto_that_fits_nothing_says_so(tmp_path):
    """A device too small for any micro-batch: the smallest runs, and the terminal and the
    result's warnings say so (the run itself is not prevented: its outcome is the evidence)."""
    d = tmp_path / "run"
    proc = bench("run", "debug=fast", "launcher.nproc=1", "logger=none", "run.micro_batch=auto",
                 "run.device_memory_gb=0.001", f"run.dir={d}")
    text = "run.micro_batch=auto: no micro-batch fits the device; running micro-batch 1"
    assert f"bench: warning: {text}" in proc.stderr, proc.stderr
    rec = json.loads((d / "result.json").read_text())
    assert any(w.startswith(text) for w in rec["warnings"]), rec["warnings"]
    assert rec["parallel"]["micro_batch_auto"]["fits"] is False


def test_wandb_online_without_a_network_says_why_at_once(tmp_path):
    from ddlbench.sinks import unreachable, wandb_host
    assert wandb_host({"WANDB_BASE_URL": "http://127.0.0.1:9"}) == ("127.0.0.1", 9)
    assert wandb_host({}) == ("api.wandb.ai", 443)
    reason = unreachable(("127.0.0.1", 9))      # the discard port: nothing listens, refused at once
    assert reason.startswith("no network: cannot reach the W&B server 127.0.0.1:9")
    assert unreachable(("no-such-host.invalid", 443)).startswith("no network: cannot reach the W&B server")


def test_a_quiet_start(tmp_path):
    """`bench run` in a fresh interpreter (what a user types): no third-party log line on the
    terminal; the one known to appear (torchao's deprecated pytree registration, logged by torch)
    is kept in the run's third_party.log instead."""
    from conftest import bench_exe
    d = tmp_path / "run"
    proc = bench_exe("run", "debug=fast", "framework=ddp", "model=gpt2_tiny", "logger=none", f"run.dir={d}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr
    assert proc.stdout.splitlines()[0].startswith("framework ")
    assert "is an Enum subclass" in (d / "third_party.log").read_text()   # torchao is in the venv (float8)


def test_a_stopped_bench_project_says_one_line_and_leaves_nothing(tmp_path):
    """`bench project` for a GPU (hardware=H100) measures the model's memory profile in a spawned
    process (ddlbench/estimate/profile.py). SIGINT while it does, in a fresh interpreter (what a user
    types): exit 130, the one line, no traceback, and no "leaked semaphore" warning (a pool's
    semaphores were, issue 66); the spawned process goes with the command."""
    import subprocess

    from conftest import BENCH_EXE, REPO
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["DDLBENCH_PROFILE_CACHE"] = str(tmp_path / "cache")      # measured, not read from a cache
    proc = subprocess.Popen([BENCH_EXE, "project", "model=llama_tiny", "framework=fsdp_full", "network=dgx_h100",
                             "hardware=H100", "world_sizes=[8]", f"out={tmp_path / 'p'}"], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    spawned: list[int] = []

    def profiling() -> bool:
        for cmd in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                stat = (cmd.parent / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid and b"spawn_main" in cmd.read_bytes():
                    spawned.append(int(cmd.parent.name))
            except (OSError, ValueError, IndexError):
                continue
        return bool(spawned)
    try:
        wait_for(profiling, 120, "bench project's spawned profile process", 0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        try:       # read before the clean-up below: gone, or a zombie its parent no longer reaps
            gone = "Z" in Path(f"/proc/{spawned[0]}/stat").read_text().split()[2]
        except FileNotFoundError:
            gone = True
    finally:
        proc.kill()
        for pid in spawned:      # a failed test leaves no profile process behind either
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.strip() == "bench: stopped by SIGINT", err
    assert gone, f"the profile process {spawned[0]} outlived the command"
    assert not (tmp_path / "p").exists()


def test_a_stop_signal_to_commbench_ends_its_ranks(tmp_path):
    """`bench commbench` starts its ranks itself (torch.multiprocessing): SIGTERM to its pid ends
    them too, one line, exit 143, no record written."""
    proc = bench_background("commbench", "launcher.nproc=2", "sizes=[4194304]", "iters=100000",
                            f"out={tmp_path / 'cb'}")
    try:
        def ranks() -> int:      # the command's child processes: its two ranks (and mp's resource tracker)
            out = 0
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    out += int(stat.read_text().rsplit(")", 1)[1].split()[1]) == proc.proc.pid
                except (OSError, ValueError, IndexError):
                    continue
            return out
        wait_for(lambda: ranks() >= 2, 60, "commbench's ranks to start", 0.2)
        time.sleep(2)            # they join their group and all-reduce
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.assert_nothing_left()
    err = proc.completed().stderr
    assert "bench: stopped by SIGTERM" in err and "Traceback" not in err, err
    assert not (tmp_path / "cb" / "commbench.json").exists()


def test_library_lines_that_do_not_concern_the_run_are_kept_not_shown(tmp_path, monkeypatch):
    """What FSDP2's and DeepSpeed's cells printed on make bench's screen: torch's FutureWarning for
    the c10d functions they call, DeepSpeed's "No CUDA runtime" on a CPU machine. Kept, not shown;
    any other warning still goes to the terminal (the original showwarning)."""
    import logging

    from ddlbench.lifecycle import quiet
    quiet.install()
    shown = []
    monkeypatch.setattr(quiet, "_show_original", lambda message, *rest: shown.append(str(message)))
    before = quiet.kept()
    quiet._show(FutureWarning("`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
                              "`torch.distributed.reduce_scatter_single` instead."), FutureWarning, "c10d_logger.py", 83)
    quiet._show(UserWarning("something about your run"), UserWarning, "x.py", 1)
    assert shown == ["something about your run"]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.addHandler(handler)
    try:
        logger.warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
        logger.warning("a line about your run")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["a line about your run"]
    new = quiet.kept()[len(before):]
    assert any("reduce_scatter_tensor" in k for k in new) and any("No CUDA runtime" in k for k in new)
    quiet.write_kept(tmp_path / "third_party.log")
    assert "No CUDA runtime" in (tmp_path / "third_party.log").read_text() and quiet.kept() == []


def test_under_srun_a_rank_that_fails_while_stopping_keeps_rank_0s_timeout_result(tmp_path, monkeypatch):
    """launcher=slurm: on SIGUSR1 rank 0 writes the `timeout` result and exits; a peer still inside
    a collective then fails (its peer is gone) a moment before srun ends it. That failure is the
    stop's consequence: it never replaces the result (CI of 2c09fe7 saw `failed` for this race)."""
    from ddlbench.launch import slurm
    from ddlbench.lifecycle import stop
    from ddlbench.planning.config import compose_raw, validate
    from ddlbench.record.results import Record, error_info, load_result
    plan = validate(compose_raw(["framework=ddp", "model=gpt2_tiny", "launcher.nproc=2", "debug=fast"]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lost = RuntimeError("Connection closed by peer")

    slurm._record_failure(plan, run_dir, 1, lost)          # no stop, no result yet: the failure is the result
    first = load_result(run_dir / "result.json")
    assert first["status"] == "failed" and "rank 1" in first["error"]["message"]

    Record.new("run", plan.raw, status="timeout", precision="fp32",
               error=error_info("timeout", "stopped by SIGUSR1")).write(run_dir)
    slurm._record_failure(plan, run_dir, 1, lost)          # a timeout result is kept
    assert load_result(run_dir / "result.json")["status"] == "timeout"

    (run_dir / "result.json").unlink()
    monkeypatch.setattr(stop, "_stopping", __import__("threading").Event())
    stop._stopping.set()                                    # this rank took SIGUSR1: nothing is written
    assert stop.stopping()
    slurm._record_failure(plan, run_dir, 1, lost)
    assert not (run_dir / "result.json").exists()


def test_report_and_projection_never_replace_files_ddlbench_did_not_write(tmp_path):
    """Issue 66 (5): `bench report -o` and `bench project out=` replaced a user's report.html and
    projection.json. Refused, naming them; a directory ddlbench wrote before is written again; an
    explicit --replace / replace=true replaces on purpose."""
    from reportdata import make_record, write
    runs = tmp_path / "runs"
    two = make_record("two", world=2)
    two["comm"] = {"per_step_bytes": {"all_reduce": 4e6}, "per_step_bytes_by_group": {"all_reduce": {"2@1": 4e6}}}
    write(runs, two)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("my own report")
    (mine / "projection.json").write_text('{"mine": true}')
    proc = bench("report", str(runs), "-o", str(mine))
    assert proc.returncode == 2 and "holds report.html, which ddlbench did not write" in proc.stderr
    assert "--replace" in proc.stderr and (mine / "report.html").read_text() == "my own report"
    proc = bench("project", str(runs / "two"), "network=dgx_h100", f"out={mine}")
    assert proc.returncode == 2 and "holds projection.json, which ddlbench did not write" in proc.stderr
    assert "replace=true" in proc.stderr and (mine / "projection.json").read_text() == '{"mine": true}'
    assert "Traceback" not in proc.stderr
    # a directory of ours is written again; a new one is made
    for _ in range(2):
        proc = bench("report", str(runs), "-o", str(tmp_path / "ours"))
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = bench("report", str(runs), "-o", str(mine), "--replace")
    assert proc.returncode == 0 and (mine / "report.html").read_text() != "my own report"
    proc = bench("project", str(runs / "two"), "network=dgx_h100", f"out={mine}", "replace=true", "world_sizes=[64,8,8]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((mine / "projection.json").read_text())
    assert doc["run_id"] == "two" and [r["devices"] for r in doc["rows"]] == [8, 64]    # each size once, ascending
