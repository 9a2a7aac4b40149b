"""Views of a finished run (W&B). They read result.json + metrics.jsonl; they never touch the
timed loop, and a sink failure is a warning, never a failed run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from ddlbench.record.rundir import RunDir


def _wandb(run_dir: Path, mode: str, init_timeout_s: float) -> Optional[str]:
    """Log the run to W&B in `mode` in a child process with a hard bound (W&B cannot stall or
    crash the run that produced the data; no stdin, so it can never prompt). None on success,
    else the reason it failed."""
    budget = init_timeout_s + 60
    cmd = [sys.executable, "-m", "ddlbench.sinks.wandb_sink", str(run_dir), mode]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return f"exceeded {budget:.0f} s and was stopped"
    if proc.returncode != 0:
        return ((proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"])[0][:300]
    print(proc.stdout.strip())
    return None


def wandb_host(environ=os.environ) -> tuple[str, int]:
    """(host, port) of the W&B server an online run talks to (WANDB_BASE_URL, else W&B's cloud)."""
    url = urlsplit(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    return url.hostname or "api.wandb.ai", url.port or (80 if url.scheme == "http" else 443)


def unreachable(host_port: tuple[str, int], timeout_s: float = 5.0) -> Optional[str]:
    """Why the W&B server cannot be reached (no network, no name resolution, refused), or None."""
    import socket
    host, port = host_port
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"no network: cannot reach the W&B server {host}:{port} ({exc.strerror or exc})"
    return None


def log_to_sinks(plan, run_dir: Path, record) -> None:
    """An online run that cannot reach W&B (no network, wrong key) falls back to an offline run
    directory (`wandb sync` it later); result.json's `logging` says which mode was used and why
    (`record`: the run's ddlbench.record.results.Record, written again with it)."""
    lg = plan.cfg.logger
    if lg.name == "none" or lg.mode == "disabled":
        return
    used = lg.mode
    reason = unreachable(wandb_host()) if lg.mode == "online" else None    # seconds, not wandb's ~40 s of retries
    if reason is None:
        reason = _wandb(run_dir, lg.mode, lg.init_timeout_s)
    if reason is not None:
        print(f"bench: warning: W&B logging ({lg.mode}) failed: {reason}", file=sys.stderr)
        used = "none"
        if lg.mode == "online" and _wandb(run_dir, "offline", lg.init_timeout_s) is None:
            used = "offline"
            print("bench: W&B fell back to offline; upload later with `wandb sync "
                  f"{RunDir(run_dir).wandb}/offline-run-*`", file=sys.stderr)
    record.sections["logging"] = {"wandb": {"requested": lg.mode, "used": used, "reason": reason}}
    record.write(run_dir)
