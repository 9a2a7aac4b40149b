"""Find and read result.json files, with a progress bar; unreadable files become failures."""
from __future__ import annotations

import json
from pathlib import Path

from bench.results import SCHEMA


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
