"""Find and read result.json files, with a progress bar; unreadable files become failures."""
from __future__ import annotations

import contextlib
import gc
import json
from pathlib import Path

from ddlbench.record import rundir
from ddlbench.record.results import NOT_A_RECORD, SCHEMA, is_record, unreadable


def missing_cells(paths: list[str]) -> list[tuple[Path, dict]]:
    """Cells of every sweep among `paths` (a directory with manifest.jsonl) that have no result
    file: stand-in records with status `missing`, so the report accounts for every expected cell."""
    from ddlbench.record.readers import DamagedFile, warn_damaged
    from ddlbench.sweep import manifest
    out = []
    for p in map(Path, paths):
        if not (p / manifest.MANIFEST).is_file():
            continue
        try:
            cells = manifest.read(p)
        except DamagedFile as exc:      # the results are still reported; which cells are missing is not known
            warn_damaged([f"{exc} (cells without a result cannot be listed)"])
            continue
        for cell in cells:
            rd = rundir.of_cell(p, cell)
            d = rd.path
            if not rd.result.exists():
                out.append((d, {"schema": SCHEMA, "run_id": cell.id, "status": "missing",
                                "error": {"type": "no_result", "rank": None,
                                          "message": "expected cell has no result.json (not run, still running, "
                                                     "or killed before it could write one: see bench sweep status)"},
                                "framework": {"name": "?", "variant": None}, "model": {"name": "?"},
                                "config": {}, "overrides": " ".join(cell.overrides)}))
    return out


def load_json_files(paths: list[str], name: str) -> list[dict]:
    """Every file called `name` under the report's paths (or given directly), parsed; one that cannot
    be read is named on stderr (ddlbench/record/readers.py) and the rest used."""
    from ddlbench.record.readers import DamagedFile, read_json, warn_damaged
    out, damaged = [], []
    for p in map(Path, paths):
        for f in sorted([p] if p.name == name else p.rglob(name)):
            try:
                out.append(read_json(f, name))
            except (DamagedFile, OSError) as exc:
                damaged.append(str(exc) if isinstance(exc, DamagedFile) else f"{f}: {exc}")
    warn_damaged(damaged)
    return out


def load_commbench(paths: list[str]) -> list[dict]:
    """`bench commbench` records (commbench.json) under the report's paths: the ceilings."""
    return load_json_files(paths, "commbench.json")


def load_advice(paths: list[str]) -> list[dict]:
    """`bench advise` states (advice.json) under the report's paths."""
    return load_json_files(paths, "advice.json")


def parse_json(data: bytes):
    """orjson (several times faster on 10k files); the stdlib for what strict JSON rejects
    (NaN, written for losses a rank does not hold)."""
    try:
        import orjson
        return orjson.loads(data)
    except ImportError:
        return json.loads(data)
    except ValueError:
        return json.loads(data)


@contextlib.contextmanager
def paused_gc():
    """Tens of thousands of nested dicts: the cyclic collector would re-scan them again and
    again while they are built (half the time of a 10k-file report); nothing here is cyclic."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_records(paths: list[Path], progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    out = []
    for path in tqdm(paths, desc="results", unit="file", disable=not progress or len(paths) < 200,
                     mininterval=0.25):
        try:
            with open(path, "rb") as f:
                rec = parse_json(f.read())
            if not is_record(rec):
                raise ValueError(NOT_A_RECORD)
            out.append(rec)
        except (OSError, ValueError) as exc:
            out.append(unreadable(path, exc))
    return out
