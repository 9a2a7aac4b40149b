"""One owner per directory: a run's (`bench run`), a sweep's (`bench sweep`, `bench run -m`) and an
advise's (`bench advise`).

The owner holds an exclusive advisory lock (flock) on <dir>/owner.lock for its whole life and
writes who it is into the file (pid, host, start time, command, a random token). A second process
that wants the directory while the lock is held is refused at once with an error that names the
owner; the kernel drops the lock when the last process holding it ends, so a directory whose
owner died (SIGKILL, a lost node) is taken over, and said so.

A run's lock is inherited by the processes it forks (the elastic agent and the ranks on CPU): the
directory stays owned while any of them lives. A sweep's or an advise's lock is its own process's
only: forked cells close it (ddlbench.launch.forked), so a resume after the sweep's process died
is not refused while an orphaned cell finishes (the cell's own lock makes the resume wait for it).

Under launcher=slurm every srun task of a run is `bench run` on one directory: the first task to
lock it owns it and the other tasks of the same Slurm step join it; a task of another step is
refused like any other process."""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from ddlbench.errors import ConfigError
from ddlbench.record import rundir

TOKEN_ENV = "DDLBENCH_RUN_TOKEN"      # the ranks' check that the directory is still their launcher's
_parent_only: list[int] = []          # descriptors a forked child closes (sweep and advise locks)


def parent_only_fds() -> list[int]:
    """The lock descriptors that are this process's alone (a forked child closes them)."""
    return list(_parent_only)


def forget_parent_only() -> None:
    """In a forked child, after closing them: the parent's locks are not this process's."""
    _parent_only.clear()


def slurm_step() -> Optional[str]:
    job = os.environ.get("SLURM_JOB_ID")
    return f"{job}.{os.environ.get('SLURM_STEP_ID', '0')}" if job else None


def describe(owner: dict) -> str:
    """'pid 123 on host h since 2026-11-27T10:00:00 (bench run)'."""
    if not owner:
        return "an owner that has not yet said who it is"
    text = f"pid {owner.get('pid')} on host {owner.get('host')} since {owner.get('started')}"
    extra = [owner.get("command")] + ([f"Slurm step {owner['slurm_step']}"] if owner.get("slurm_step") else [])
    return text + f" ({', '.join(x for x in extra if x)})"


def read_owner(path: Path) -> dict:
    """What an owner file says (empty: none, or not yet written, or damaged)."""
    try:
        text = Path(path).read_text()
        owner = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


@dataclass
class Owner:
    """A held directory. `reclaimed`: what the previous owner file said when its owner had died."""
    directory: Path
    token: str
    file: Optional[IO] = field(default=None, repr=False)
    reclaimed: Optional[dict] = None

    def release(self) -> None:
        """Empty the owner file and drop the lock (processes that inherited it keep it until they end)."""
        if self.file is None:
            return
        try:
            if self.file.fileno() in _parent_only:
                _parent_only.remove(self.file.fileno())
            self.file.seek(0)
            self.file.truncate()
            self.file.flush()
        except (OSError, ValueError):
            pass
        finally:
            self.file.close()
            self.file = None

    def __enter__(self) -> "Owner":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def refuse_foreign(directory: Path) -> None:
    """A run directory is ddlbench's own or refused (issue 66: a user's config.json, events.jsonl
    and thesis.tex were written over without a word): it must not exist yet, be empty, or hold an
    owner.lock (a run of ours that ended without a result: its attempt is run again). Followed
    through a symlink; a dangling link, or a file in the directory's place, is said."""
    directory = Path(directory)
    if directory.is_symlink() and not directory.exists():
        raise ConfigError(f"run.dir {directory} is a symlink to {os.readlink(directory)}, which does not exist")
    if not directory.exists():
        return
    if not directory.is_dir():
        raise ConfigError(f"run.dir {directory} exists and is not a directory")
    entries = sorted(p.name for p in directory.iterdir())
    if entries and rundir.OWNER not in entries:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ConfigError(f"run.dir {directory}{' (a symlink to ' + str(directory.resolve()) + ')' if directory.is_symlink() else ''} "
                          f"holds files ddlbench did not write ({shown}); give a new or empty directory")


def claim_output(directory: Path, command: str, names: list[str], replace_hint: str, replace: bool = False) -> Path:
    """An output directory for `command`'s files `names` (issue 66: `bench report -o` and `bench
    project out=` replaced a user's report.html and projection.json): new, or one ddlbench wrote
    before (its marker, rundir.OUTPUT_MARKER), or one that holds none of `names`; otherwise
    refused, naming the files and `replace_hint` (how to replace them on purpose). Made before any
    work, so a file in its place is said at once."""
    from ddlbench.record.results import atomic_write_json
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory}: exists and is not a directory (the output is a directory of files)")
    marker = directory / rundir.OUTPUT_MARKER
    if directory.is_dir() and not marker.exists() and not replace:
        clash = sorted(n for n in names if (directory / n).exists())
        if clash:
            raise ConfigError(f"{directory} holds {', '.join(clash)}, which ddlbench did not write: give another "
                              f"directory, or {replace_hint} to replace them")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_json(marker, {"command": command, "files": sorted(names),
                                   "written": _dt.datetime.now().astimezone().isoformat(timespec="seconds")})
    except OSError as exc:
        raise ConfigError(f"{directory}: cannot make the output directory ({exc.strerror or exc})") from None
    return directory


def take(directory: Path, command: str, *, inherited: bool = True, quiet: bool = False) -> Owner:
    """Own `directory` (created if needed) for this process's life, or ConfigError naming the owner.
    `inherited`: forked children keep the lock (a run's agent and ranks), else they close it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / rundir.OWNER
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        owner = _wait_for_owner(path)
        step = slurm_step()
        if step is not None and owner.get("slurm_step") == step:   # another srun task of this run
            return Owner(directory, owner.get("token", ""))
        raise ConfigError(f"{directory} is in use by another {command}: {describe(owner)}; wait until it ends, "
                          f"or give this one another directory") from None
    f.seek(0)
    previous = read_owner(path)
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
          "command": command, "token": secrets.token_hex(8), "slurm_step": slurm_step()}
    f.seek(0)
    f.truncate()
    f.write(json.dumps(me))
    f.flush()
    os.fsync(f.fileno())
    if not inherited:
        _parent_only.append(f.fileno())
    owner = Owner(directory, me["token"], f, previous or None)
    if previous and not quiet:
        print(f"bench: warning: {directory} was owned by {describe(previous)}, which ended without releasing it; "
              f"taken over", file=sys.stderr, flush=True)
    return owner


def _wait_for_owner(path: Path, bound_s: float = 2.0) -> dict:
    """The holder writes who it is right after it locks: give it a moment."""
    deadline = time.monotonic() + bound_s
    while True:
        owner = read_owner(path)
        if owner or time.monotonic() > deadline:
            return owner
        time.sleep(0.05)


def check_token(directory: Path, environ=os.environ) -> None:
    """On a rank: the directory still belongs to the launcher that started it (its token, passed in
    the environment), so the config.json it reads is that launcher's. RuntimeError otherwise."""
    token = environ.get(TOKEN_ENV)
    if not token:
        return
    owner = read_owner(Path(directory) / rundir.OWNER)
    if owner.get("token") != token:
        raise RuntimeError(f"{directory} is no longer this rank's launcher's (owner now: {describe(owner)}); "
                           "refusing to read another run's config")
