"""The result record (docs/design.md §6): a contract other tools read. Written atomically, always."""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from ddlbench.record.rundir import RESULT as RESULT_FILE  # the run directory's names live in ddlbench/record/rundir.py
from ddlbench.record.rundir import RunDir

SCHEMA = "ddlbench.result/1"
STATUSES = ("ok", "failed", "timeout", "oom", "unsupported")
REQUIRED = ("schema", "run_id", "status", "error", "framework", "model", "parallel", "precision",
            "seed", "env", "timing", "throughput", "memory", "comm", "mfu", "convergence", "config")


def atomic_write_json(path: Path, obj: Any) -> None:
    """Temp file in the same directory, fsync, os.replace, fsync the directory: a reader sees
    the old file or the new one, never a half-written one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(finite(obj), f, indent=2, sort_keys=False, default=_jsonable, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def finite(obj: Any) -> Any:
    """`obj` with every NaN and infinity replaced by None: what we write is strict JSON (most JSON
    readers refuse bare NaN/Infinity). A loss that diverged to NaN reads as null, a missing value."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):     # numpy / torch scalars
        try:
            return finite(obj.item())
        except (TypeError, ValueError):
            return obj
    return obj


def _jsonable(o: Any):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@dataclass
class Record:
    """One run's result.json in memory: the fields every record has (REQUIRED), typed, and the
    optional sections a run adds (flops, gpu, startup_s, stragglers, model_parallel, trace,
    final_params, partial, logging, ...) in `sections`. Built once by whoever ends the run (rank 0's
    collect.py, or the launcher for a run whose ranks wrote nothing), written with `write`, read
    back with `from_json`; readers of finished runs (report, table, advise) take the JSON dict."""
    run_id: str
    status: str
    config: dict
    error: Optional[dict] = None
    framework: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    parallel: Optional[dict] = None
    precision: Optional[str] = None
    seed: Optional[int] = None
    env: Optional[dict] = None
    timing: Optional[dict] = None
    throughput: Optional[dict] = None
    memory: Optional[dict] = None
    comm: Optional[dict] = None
    mfu: Optional[float] = None
    convergence: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    sections: dict = field(default_factory=dict)
    schema: str = SCHEMA

    @classmethod
    def new(cls, run_id: str, config: dict, status: str = "failed", precision: Optional[str] = None,
            error: Optional[dict] = None) -> "Record":
        """Every required field present, measurements null until filled. `precision`: what ran
        where the config says auto (Plan.cfg.run.precision)."""
        fw, mc, run = config.get("framework", {}), config.get("model", {}), config.get("run", {})
        return cls(run_id=run_id, status=status, config=config, error=error,
                   framework={"name": fw.get("name"), "variant": fw.get("variant"), "version": None,
                              "native_config": None},
                   model={"name": mc.get("name"), "preset": mc.get("name"), "kind": mc.get("kind"),
                          "params": None},
                   precision=precision or run.get("precision"), seed=run.get("seed"),
                   convergence={"train_loss": [], "eval": [], "target": run.get("target"),
                                "time_to_target_s": None, "epochs_to_target": None})

    def to_json(self) -> dict:
        """result.json's object: the required fields in REQUIRED's order, warnings, then the sections."""
        out = {k: getattr(self, k) for k in REQUIRED}
        return {**out, "warnings": self.warnings, **self.sections}

    @classmethod
    def from_json(cls, obj: dict) -> "Record":
        names = {f.name for f in fields(cls)} - {"sections"}
        return cls(**{k: v for k, v in obj.items() if k in names},
                   sections={k: v for k, v in obj.items() if k not in names})

    def write(self, run_dir: Path) -> Path:
        """The one writer of result.json: refuses an invalid record, writes atomically."""
        obj = self.to_json()
        problems = check_record(obj)
        if problems:
            raise ValueError(f"refusing to write an invalid result: {problems}")
        path = RunDir(run_dir).result
        atomic_write_json(path, obj)
        return path


def error_info(type_: str, message: str, rank: Optional[int] = None, **extra) -> dict:
    return {"type": type_, "message": message, "rank": rank, **extra}


def unreadable(path: Path, exc: Exception) -> dict:
    """A stand-in record, so a corrupt result is listed among the failures, never dropped."""
    return {"schema": SCHEMA, "run_id": path.parent.name, "status": "failed",
            "error": {"type": "unreadable_result", "rank": None,
                      "message": str(exc) if str(path) in str(exc) else f"{path}: {exc}"},
            "framework": {"name": "?", "variant": None}, "model": {"name": "?"}, "config": {}}


def load_result(path: Path) -> dict:
    """A result.json (or the one in a run directory); ddlbench.record.readers.DamagedFile (a ConfigError)
    when it is truncated, not JSON or not a record."""
    from ddlbench.record.readers import DamagedFile, read_json
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    obj = read_json(path, "result record")
    if not is_record(obj):
        raise DamagedFile(path, "result record", NOT_A_RECORD)
    return obj


NOT_A_RECORD = "not a ddlbench result (no status, framework or model)"


def is_record(obj) -> bool:
    """What every reader of result.json relies on: a dict with a status, a framework and a model."""
    return (isinstance(obj, dict) and isinstance(obj.get("status"), str) and isinstance(obj.get("framework"), dict)
            and isinstance(obj.get("model"), dict))


def find_results(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / RESULT_FILE).is_file():
            found.append(p / RESULT_FILE)
        elif p.is_dir():
            for root, dirs, files in os.walk(p):  # faster than rglob on 10k+ directories
                dirs[:] = [d for d in dirs if not d.startswith(".")]  # e.g. a sweep's .attempts/
                if RESULT_FILE in files:
                    found.append(Path(root) / RESULT_FILE)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return sorted(set(found))


def check_record(record: dict) -> list[str]:
    """What is wrong with a record (empty list = valid). Used by writers and by tests."""
    problems = [f"missing {k}" for k in REQUIRED if k not in record]
    if record.get("schema") != SCHEMA:
        problems.append(f"schema must be {SCHEMA}")
    if record.get("status") not in STATUSES:
        problems.append(f"status must be one of {STATUSES}")
    if record.get("status") == "ok":
        for k in ("timing", "throughput", "memory", "parallel", "env"):
            if not record.get(k):
                problems.append(f"ok result without {k}")
        if record.get("error") is not None:
            problems.append("ok result with an error")
    elif record.get("error") is None:
        problems.append("non-ok result without an error")
    mfu = record.get("mfu")
    if mfu is not None and not (0 < mfu <= 1):
        problems.append(f"mfu {mfu} outside (0, 1]")
    return problems
