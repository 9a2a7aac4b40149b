"""The one way our commands read the JSON files that runs, sweeps and advice leave behind
(result.json, manifest.jsonl, sweep.json, advice.json): a file that is truncated, empty, not JSON,
or JSON of the wrong shape is a DamagedFile naming the file and what is wrong. Callers that read
many files (bench table, bench report) list it and go on with the rest; callers that cannot go on
without it (bench project, sweep resume/status, advise resume) refuse with exit 2 (DamagedFile is
a ConfigError), never a traceback."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlbench.errors import ConfigError


class DamagedFile(ConfigError):
    """A file we wrote (or a user handed us) cannot be read back."""

    def __init__(self, path: Path, what: str, problem: str):
        super().__init__(f"{path}: damaged {what} ({problem})")
        self.path, self.what, self.problem = Path(path), what, problem


def _problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; truncated or overwritten?"
    return str(exc) or type(exc).__name__


def read_json(path: Path, what: str, kind: type = dict) -> Any:
    """The parsed file, which must be a `kind` (a dict by default), or DamagedFile. A missing file
    is FileNotFoundError, as before: callers say what its absence means."""
    path = Path(path)
    text = path.read_text(errors="replace")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise DamagedFile(path, what, "empty file" if not text.strip() else _problem(exc)) from None
    if not isinstance(obj, kind):
        raise DamagedFile(path, what, f"expected a JSON {kind.__name__}, found {type(obj).__name__}")
    return obj


def read_jsonl(path: Path, what: str) -> list[dict]:
    """One JSON object per non-empty line, or DamagedFile naming the first bad line."""
    path = Path(path)
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DamagedFile(path, what, f"line {n}: {_problem(exc)}") from None
        if not isinstance(obj, dict):
            raise DamagedFile(path, what, f"line {n}: expected a JSON object, found {type(obj).__name__}")
        out.append(obj)
    return out


def warn_damaged(problems: list[str], stream=None) -> None:
    """One line per file that could not be read, on stderr: the rest was used."""
    import sys
    for p in problems:
        print(f"bench: warning: skipped {p}", file=stream or sys.stderr)
