"""`bench advise`'s state, typed: what advice.json holds between its phases (command.py drives
them). Candidates stay rows (dicts): the grid's row per candidate that rank.py fills with its
prediction and conclude.py with its measurements; the report and docs/advise.md read them as
written. `from_json` takes any advice.json this version wrote; a field it lacks takes its default."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Optional

PHASES = ("calibrate", "measure", "done")


@dataclass
class Calibration:
    """Phase 1: the calibration cells (one per framework and micro-batch), the frameworks that
    could not calibrate and why; then, from their results (rank.py), DDP's step per micro-batch,
    every framework's compute factor over DDP and runtime memory overhead, the recompute factor,
    the communication factor of a framework whose collectives bypass c10d, and the device-seconds
    it cost."""
    cells: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    ddp_step_s: Optional[dict] = None
    compute_factor: Optional[dict] = None
    runtime_overhead_bytes: Optional[dict] = None
    recompute: Optional[float] = None
    comm_factor: Optional[dict] = None     # {framework: its collectives measured / priced} (own_collectives cells)
    device_s: float = 0.0


@dataclass
class Advice:
    phase: str = "calibrate"               # calibrate -> measure -> done
    options: dict = field(default_factory=dict)    # the arguments, resolved (options.parse)
    extra_overrides: list = field(default_factory=list)
    network: str = ""
    network_source: Optional[str] = None   # a file given as network= has no conf name
    devices_per_node: int = 1
    device: str = "cpu"
    precision: Optional[str] = None
    device_memory_bytes: Optional[int] = None
    device_memory_source: Optional[str] = None
    optimizer: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict)
    oversubscription: float = 1.0          # CPU: ranks x threads over a node's cores, against calibration's
    calibration: Calibration = field(default_factory=Calibration)
    candidates: list = field(default_factory=list)
    rounds: list = field(default_factory=list)     # phase 2's sweeps: {dir, cells, why, folded}
    decision: Optional[dict] = None
    rank_correlation: Optional[float] = None
    memory_error_by_framework: dict = field(default_factory=dict)
    recommendation: Optional[dict] = None
    evaluation: Optional[dict] = None      # evaluate=all

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "Advice":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise ValueError(f"advice.json has fields this version does not know: {', '.join(unknown)}")
        if obj.get("phase", "calibrate") not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {obj.get('phase')!r}")
        for key, kind in (("options", dict), ("candidates", list), ("rounds", list), ("calibration", dict)):
            if key in obj and not isinstance(obj[key], kind):
                raise ValueError(f"{key} must be a JSON {kind.__name__}, got {type(obj[key]).__name__}")
        if obj.get("phase") in ("measure", "done") and not obj.get("candidates"):
            raise ValueError(f"phase {obj['phase']!r} without candidates")
        if obj.get("phase") == "measure" and not obj.get("rounds"):
            raise ValueError("phase 'measure' without the rounds it measures")
        _check_candidates(obj.get("candidates") or [], obj.get("rounds") or [])
        cal = obj.get("calibration") or {}
        cal_names = {f.name for f in fields(Calibration)}
        if set(cal) - cal_names:
            raise ValueError(f"calibration has fields this version does not know: {', '.join(sorted(set(cal) - cal_names))}")
        return cls(**{**{k: v for k, v in obj.items() if k in names},
                      "calibration": Calibration(**cal)})


# what every candidate row holds from the grid on (rank.candidate_row), and its type
CANDIDATE_KEYS = {"id": str, "label": str, "framework": str, "overrides": list}


def _check_candidates(candidates: list, rounds: list) -> None:
    """ValueError naming the first candidate or round that advise could not continue from (a
    KeyError deep in a later phase, before)."""
    ids = set()
    for n, c in enumerate(candidates):
        if not isinstance(c, dict):
            raise ValueError(f"candidates[{n}] must be a JSON object, got {type(c).__name__}")
        for key, kind in CANDIDATE_KEYS.items():
            if not isinstance(c.get(key), kind):
                got = "nothing" if key not in c else type(c[key]).__name__
                raise ValueError(f"candidates[{n}].{key} must be a JSON {'string' if kind is str else 'list'}, got {got}")
        if not all(isinstance(o, str) for o in c["overrides"]):
            raise ValueError(f"candidates[{n}].overrides must hold strings")
        ids.add(c["id"])
    for n, r in enumerate(rounds):
        if not isinstance(r, dict) or not isinstance(r.get("dir"), str) or not isinstance(r.get("cells"), list):
            raise ValueError(f"rounds[{n}] must be a JSON object with a 'dir' string and a 'cells' list")
        for cell in r["cells"]:
            if not (isinstance(cell, list) and len(cell) == 2 and cell[0] in ids and isinstance(cell[1], int)):
                raise ValueError(f"rounds[{n}].cells holds {cell!r}: each cell is [a candidate's id, a repeat index]")
