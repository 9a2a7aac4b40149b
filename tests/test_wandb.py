"""W&B is a view of result.json: offline by default, and never able to fail or stall a run."""
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
    # a stall would hit run_record's subprocess bound (240 s) and fail the test
    proc, rec = run_record(run_dir, *FAST, "logger=wandb", "logger.mode=online", "logger.init_timeout_s=5")
    assert rec["status"] == "ok" and proc.returncode == 0
    assert "warning: W&B logging" in proc.stderr
    # the cause, found in seconds by a connection attempt, not wandb's hint after ~40 s of retries
    assert "W&B logging (online) failed: no network: cannot reach the W&B server api.wandb.ai:443" in proc.stderr
    assert rec["logging"]["wandb"]["used"] == "offline"
    assert rec["logging"]["wandb"]["reason"].startswith("no network: cannot reach the W&B server")


def test_wrong_key_without_tty_falls_back_to_offline_and_the_result_says_so(run_dir):
    """An online run against a W&B server that rejects the key (a local server answering 401 to
    everything), no stdin and no controlling terminal: the run never prompts or blocks, W&B falls
    back to an offline run directory, and result.json's `logging` records it."""
    import json
    import os
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from conftest import BENCH, REPO

    hits = []

    class Reject(BaseHTTPRequestHandler):
        def _deny(self):
            hits.append(self.path)
            body = b'{"errors": [{"message": "user is not logged in"}]}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _deny

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Reject)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_API_KEY="0123456789abcdef" * 2 + "deadbeef", WANDB_BASE_URL=f"http://127.0.0.1:{server.server_port}")
    try:   # no prompt, no stall: a hang would hit the 240 s bound below and fail the test
        proc = subprocess.run([*BENCH, "run", *FAST, "logger=wandb", "logger.mode=online", "logger.init_timeout_s=10",
                               "run.progress=false", f"run.dir={run_dir}"], cwd=REPO, env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, start_new_session=True, timeout=240)
    finally:
        server.shutdown()
    rec = json.loads((run_dir / "result.json").read_text())
    assert proc.returncode == 0 and rec["status"] == "ok", proc.stderr[-2000:]
    assert hits, "W&B never contacted the (rejecting) server"
    assert rec["logging"]["wandb"]["requested"] == "online" and rec["logging"]["wandb"]["used"] == "offline"
    assert rec["logging"]["wandb"]["reason"]
    assert "W&B fell back to offline" in proc.stderr
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
