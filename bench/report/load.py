"""Find and read result.json files, with a progress bar; unreadable files become failures."""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench.results import RESULT_FILE, SCHEMA


def find_results(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / RESULT_FILE).is_file():
            found.append(p / RESULT_FILE)
        elif p.is_dir():
            for root, _dirs, files in os.walk(p):  # faster than rglob on 10k+ directories
                if RESULT_FILE in files:
                    found.append(Path(root) / RESULT_FILE)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return sorted(set(found))


def unreadable(path: Path, exc: Exception) -> dict:
    """A stand-in record, so a corrupt result is listed among the failures, never dropped."""
    return {"schema": SCHEMA, "run_id": path.parent.name, "status": "failed",
            "error": {"type": "unreadable_result", "message": f"{path}: {exc}", "rank": None},
            "framework": {"name": "?", "variant": None}, "model": {"name": "?"}, "config": {}}


def load_records(paths: list[Path], progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    out = []
    for path in tqdm(paths, desc="results", unit="file", disable=not progress or len(paths) < 200,
                     mininterval=0.25):
        try:
            with open(path, "rb") as f:
                out.append(json.loads(f.read()))
        except (OSError, ValueError) as exc:
            out.append(unreadable(path, exc))
    return out
