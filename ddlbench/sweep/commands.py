"""`bench sweep [options] overrides...`, `bench sweep status DIR`, `bench sweep resume DIR`."""
from __future__ import annotations

import datetime as _dt
import math
import re
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.lifecycle import ownership
from ddlbench.record import rundir
from ddlbench.record.results import atomic_write_json
from ddlbench.sweep import manifest, status
from ddlbench.sweep.cells import expand

# Cells get run.dir as a quoted Hydra override (spaces, commas, quotes are fine); what stays out:
# '%' (Slurm expands it in --output file names), '${' (OmegaConf interpolation), control characters.
UNSAFE_DIR = re.compile(r"[%\x00-\x1f\x7f]|\$\{")


def _slurm_minutes(cells) -> int:
    """The array's time limit: the longest wall-clock bound among cells plus 5 minutes for
    start-up and the result."""
    from ddlbench.planning.config import plan_from_overrides
    return math.ceil(max(plan_from_overrides(c.overrides).cfg.run.timeout_s for c in cells) / 60) + 5


def _slurm_arrays(cells, indices: list[int], cpus_per_rank: int) -> dict:
    """Array tasks grouped by what each asks Slurm for (ddlbench.sweep.slurm.cell_shape): one job
    array per shape, so a cell spanning two nodes gets two nodes and a 1-rank cell one CPU."""
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.sweep.slurm import cell_shape
    groups: dict = {}
    for i in indices:
        shape = cell_shape(plan_from_overrides(cells[i].overrides).cfg.launcher, cpus_per_rank)
        groups.setdefault(shape, []).append(i)
    return groups


def start(args) -> int:
    sweep_dir = Path(args.dir or rundir.sweep_root("sweeps"))
    bad = UNSAFE_DIR.search(str(sweep_dir))
    if bad:
        raise ConfigError(f"--dir {str(sweep_dir)!r}: {bad.group()!r} is not allowed in a sweep directory "
                          "('%' is a Slurm file-name pattern, '${' an interpolation)")
    cells = expand(args.overrides, args.repeats)
    return start_cells(sweep_dir, cells, {"overrides": args.overrides, "repeats": args.repeats}, args.backend,
                       cpus_per_rank=args.cpus_per_rank, throttle=args.throttle, job_name=args.job_name)


def start_cells(sweep_dir: Path, cells: list, meta: dict, backend: str, cpus_per_rank: int = 1,
                throttle: int | None = None, job_name: str = "ddlbench") -> int:
    """Write the manifest of `cells` (validated) and run them (local) or submit them (Slurm)."""
    meta = {"created": _dt.datetime.now().astimezone().isoformat(), **meta, "backend": backend, "jobs": []}
    if backend == "slurm":
        meta["slurm"] = {"cpus_per_rank": cpus_per_rank, "time_limit_min": _slurm_minutes(cells),
                         "throttle": throttle, "job_name": job_name}
    with ownership.take(sweep_dir, "sweep", inherited=False):
        try:
            manifest.create(sweep_dir, cells, meta)
        except FileExistsError as exc:
            raise ConfigError(str(exc)) from None
        print(f"sweep: {len(cells)} cells in {sweep_dir} (manifest.jsonl)")
        return _launch(sweep_dir, meta, [c.index for c in cells])


def _launch(sweep_dir: Path, meta: dict, indices: list[int]) -> int:
    if meta["backend"] == "local":
        from ddlbench.sweep import local
        codes = local.run(sweep_dir, indices)
        print(status.render(status.cell_states(sweep_dir)))
        return 0 if all(c == 0 for c in codes.values()) else 1
    from ddlbench.sweep import slurm
    s = meta["slurm"]
    arrays = _slurm_arrays(manifest.read(sweep_dir), indices, s.get("cpus_per_rank", 1))
    for shape, group in arrays.items():
        try:
            job = slurm.submit(sweep_dir, group, shape=shape, time_limit_min=s["time_limit_min"],
                               throttle=s["throttle"], job_name=s["job_name"])
        except slurm.SlurmError as exc:
            raise ConfigError(str(exc)) from None
        meta["jobs"].append(job)
        atomic_write_json(sweep_dir / manifest.META, meta)
        print(f"submitted job array {job} ({len(group)} tasks, {shape.nodes} node(s) x {shape.ntasks} task(s) x "
              f"{shape.cpus_per_task} CPU(s) each); follow with: bench sweep status {sweep_dir}")
    return 0


def _queued_ids(sweep_dir: Path, meta: dict) -> set[str]:
    if meta.get("backend") != "slurm" or not meta.get("jobs"):
        return set()
    from ddlbench.sweep import slurm
    cells = manifest.read(sweep_dir)
    try:
        return {cells[i].id for i in slurm.queued(meta["jobs"]) if i < len(cells)}
    except slurm.SlurmError as exc:
        print(f"bench: warning: {exc}; queue state unknown")
        return set()


def _accounting(meta: dict) -> dict[int, dict]:
    if meta.get("backend") != "slurm" or not meta.get("jobs"):
        return {}
    from ddlbench.sweep import slurm
    return slurm.accounted(meta["jobs"])


def show_status(sweep_dir: Path) -> int:
    meta = _meta(sweep_dir)
    rows = status.cell_states(sweep_dir, _queued_ids(sweep_dir, meta), _accounting(meta))
    print(status.render(rows))
    return 0


def resume(sweep_dir: Path) -> int:
    meta = _meta(sweep_dir)
    with ownership.take(sweep_dir, "sweep", inherited=False):
        return _resume(sweep_dir, meta)


def _resume(sweep_dir: Path, meta: dict) -> int:
    rows = status.cell_states(sweep_dir, _queued_ids(sweep_dir, meta), _accounting(meta))
    todo = [r["index"] for r in rows if r["state"] not in ("ok", "running")]
    if not todo:
        print("nothing to resume: every cell has an ok result or is queued")
        return 0
    print(f"resuming {len(todo)} of {len(rows)} cells")
    return _launch(sweep_dir, meta, todo)


def _meta(sweep_dir: Path) -> dict:
    try:
        return manifest.meta(sweep_dir)
    except FileNotFoundError:
        raise ConfigError(f"{sweep_dir}: not a sweep directory (no {manifest.META})") from None
