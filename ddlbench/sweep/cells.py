"""Expand a sweep into cells, each with a stable id = hash of its resolved config (which holds
the repeat index, run.repeat)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from ddlbench.errors import ConfigError

# keys that do not change what a cell measures (where it writes, how it shows progress)
_VOLATILE = (("run", "dir"), ("run", "progress"))


@dataclass(frozen=True)
class Cell:
    index: int
    id: str
    overrides: list[str]
    repeat: int
    name: str | None = None   # its directory's name when not its id (`bench run -m`: 000_ddp_2)

    def as_dict(self) -> dict:
        return asdict(self)


def cell_id(config: dict) -> str:
    cfg = json.loads(json.dumps(config))
    for group, key in _VOLATILE:
        (cfg.get(group) or {}).pop(key, None)
    return hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


def swept_keys(overrides: list[str]) -> set[str]:
    """The keys that a sweep varies (comma lists, glob, range)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "," in o or "glob(" in o or "range(" in o}


def label(combo: list[str], swept: set[str]) -> str:
    """A cell's swept values joined: framework=ddp launcher.nproc=2 -> ddp_2."""
    return "_".join(c.split("=", 1)[1] for c in combo if "," not in c and c.split("=", 1)[0].lstrip("+~") in swept)


def expand(overrides: list[str], repeats: int = 1, readable_names: bool = False) -> list[Cell]:
    """Hydra multirun semantics (cross product of comma lists, glob/range), times `repeats`, the
    repeats interleaved (A B A B, not A A B B).
    Every cell is composed and validated before anything is written or submitted.
    `readable_names`: each cell's directory is <index>_<swept values> instead of its id."""
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.planning.overrides import expand_sweep
    from ddlbench.record import rundir

    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    if any(o.split("=", 1)[0].lstrip("+") == "run.dir" for o in overrides):
        raise ConfigError("run.dir is set per cell by the sweep; use --dir for the sweep directory")
    cells: list[Cell] = []
    seen: set[str] = set()
    swept = swept_keys(overrides)
    combos = expand_sweep(overrides)
    # repeats interleaved (every configuration once, then again): a machine that drifts over the
    # sweep moves every configuration alike (ddlbench/metrics/compare.py)
    for r in range(repeats):
        for combo in combos:
            cell_overrides = [*combo, f"run.repeat={r}"] if repeats > 1 else list(combo)
            plan = plan_from_overrides(cell_overrides)
            cid = cell_id(plan.raw)
            if cid in seen:
                continue  # two spellings of one configuration: run it once
            seen.add(cid)
            name = rundir.cell_name(len(cells), label(combo, swept)) if readable_names else None
            cells.append(Cell(index=len(cells), id=cid, overrides=cell_overrides, repeat=plan.cfg.run.repeat,
                              name=name))
    return cells
