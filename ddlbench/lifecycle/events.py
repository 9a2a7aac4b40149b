"""The start-up timeline of a run: wall-clock moments (time.time(), comparable across the
processes of one machine) appended to <run_dir>/events.jsonl, one JSON object per line.

Events, in order: cli_start (the `bench` process began; written once the run directory is
known), validated, agent_start, rank_start (each rank entered its entry point), process_group
(joined), model_ready (adapter.setup returned), first_step (the first training step ended;
written after the measured window so the loop does no I/O). Lines are short single writes to
an O_APPEND file, so concurrent ranks do not interleave them. A rank of an attempt the elastic agent
restarted (launcher.max_restarts) marks its events with `attempt`; the
start-up phases are the first attempt's, a restart's are the record's `recovery`
(ddlbench/metrics/recovery.py).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ddlbench.record.rundir import RunDir

PHASES = (  # (phase name, event that ends it); each phase starts where the previous one ended
    ("cli_parse_validate", "validated"),
    ("agent_start", "agent_start"),
    ("rank_start", "rank_start"),
    ("process_group", "process_group"),
    ("model_build", "model_ready"),
    ("first_step", "first_step"),
)


def attempt() -> int:
    """Which attempt this process belongs to: 0, or how many times torch's elastic agent has restarted
    the ranks (TORCHELASTIC_RESTART_COUNT, set in each rank it starts). A requeued Slurm cell is not
    counted: `bench sweep` archives its earlier attempt and runs the cell afresh."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def mark(run_dir: str | Path, event: str, rank: int | None = None, t: float | None = None, **info) -> None:
    if "attempt" not in info and attempt():
        info["attempt"] = attempt()
    line = json.dumps({"event": event, "rank": rank, "t": time.time() if t is None else t, **info}) + "\n"
    fd = os.open(RunDir(run_dir).events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def process_start_time() -> float:
    """When this process began (Linux /proc; wall clock, ~10 ms resolution), so cli_start
    includes the interpreter's own start and imports. Elsewhere: now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age_s
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def read(run_dir: str | Path) -> list[dict]:
    path = RunDir(run_dir).events
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def info(evts: list[dict], event: str, key: str):
    """A detail recorded with an event (e.g. agent_start's start_method), or None."""
    return next((e[key] for e in evts if e["event"] == event and key in e), None)


def note(run_dir: str | Path, text: str) -> None:
    """Something the launcher saw that the run's record must say (a launch attempt killed and
    started again): the ranks' record takes it from the timeline (notes), so no one rewrites
    result.json after it is written."""
    mark(run_dir, "note", text=text)


def notes(evts: list[dict]) -> list[str]:
    return [e["text"] for e in evts if e["event"] == "note"]


def phases(evts: list[dict]) -> dict[str, float] | None:
    """Seconds per start-up phase, from cli_start to the first step. A phase ends when its event
    has happened on every process that records it (the latest moment: the slowest rank gates
    everyone). None when the timeline is incomplete."""
    latest: dict[str, float] = {}
    for e in evts:
        if e.get("attempt"):     # a restarted attempt's: the record's recovery, not the start-up
            continue
        latest[e["event"]] = max(latest.get(e["event"], e["t"]), e["t"])
    if "cli_start" not in latest or any(ev not in latest for _, ev in PHASES):
        return None
    out, prev = {}, latest["cli_start"]
    for name, ev in PHASES:
        out[name] = latest[ev] - prev
        prev = latest[ev]
    out["total_to_first_step"] = prev - latest["cli_start"]
    return out
