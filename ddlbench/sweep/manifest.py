"""The sweep directory: sweep.json (what was asked) and manifest.jsonl (one line per cell)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ddlbench.record import rundir
from ddlbench.record.readers import DamagedFile, read_json, read_jsonl
from ddlbench.record.results import atomic_write_json, load_result
from ddlbench.sweep.cells import Cell

MANIFEST = "manifest.jsonl"
META = "sweep.json"
LOGS = "logs"   # Slurm array tasks' output, <sweep>/logs/<job>_<task>.out


def create(sweep_dir: Path, cells: list[Cell], meta: dict) -> None:
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / MANIFEST).exists():
        raise FileExistsError(f"{sweep_dir} already holds a sweep; use `bench sweep resume {sweep_dir}`")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(sweep_dir, 0o700)  # configs and logs may name private paths
    atomic_write_json(sweep_dir / META, meta)
    tmp = sweep_dir / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        for c in cells:
            f.write(json.dumps(c.as_dict()) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, sweep_dir / MANIFEST)


def read(sweep_dir: Path) -> list[Cell]:
    """The cells; DamagedFile (a ConfigError) for a manifest that cannot be read back."""
    path = Path(sweep_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{sweep_dir}: no {MANIFEST} (not a sweep directory)")
    cells = []
    for n, row in enumerate(read_jsonl(path, "sweep manifest"), 1):
        try:
            cells.append(Cell(**row))
        except TypeError as exc:
            raise DamagedFile(path, "sweep manifest", f"cell {n}: {exc}") from None
        if not isinstance(cells[-1].overrides, list) or not isinstance(cells[-1].index, int):
            raise DamagedFile(path, "sweep manifest", f"cell {n}: index must be an integer and overrides a list")
    return cells


def meta(sweep_dir: Path) -> dict:
    """sweep.json; DamagedFile (a ConfigError) when it cannot be read back."""
    obj = read_json(Path(sweep_dir) / META, "sweep description")
    if obj.get("backend") not in ("local", "slurm"):
        raise DamagedFile(Path(sweep_dir) / META, "sweep description",
                          f"backend must be local or slurm, got {obj.get('backend')!r}")
    return obj


def cell_dir(sweep_dir: Path, cell: Cell) -> Path:
    return rundir.of_cell(sweep_dir, cell).path


def cell_result(sweep_dir: Path, cell: Cell):
    """The cell's result record, or None when it has none (yet)."""
    path = rundir.of_cell(sweep_dir, cell).result
    if not path.exists():
        return None
    try:
        return load_result(path)
    except (OSError, ValueError):
        return None
