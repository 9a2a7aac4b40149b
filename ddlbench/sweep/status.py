"""Where every cell of a sweep stands: its result's status, running (Slurm), or missing."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ddlbench.sweep import manifest


def cell_states(sweep_dir: Path, running_ids: set[str] = frozenset(),
                accounting: dict[int, dict] | None = None) -> list[dict]:
    """One row per cell. A cell without a result takes its state from Slurm's accounting
    (`accounting`: array index -> sacct row) when there is one: cancelled, timeout,
    out_of_memory, node_fail... (a task killed that way could not write its result)."""
    rows = []
    for cell in manifest.read(sweep_dir):
        rec = manifest.cell_result(sweep_dir, cell)
        acct = (accounting or {}).get(cell.index)
        ended_by_slurm = acct is not None and acct["state"] not in ("PENDING", "RUNNING", "COMPLETED")
        if rec is not None and ended_by_slurm and (rec.get("error") or {}).get("type") == "terminated":
            # scancel/time limit: the launcher wrote a `terminated` result on SIGTERM; Slurm knows why
            state = acct["state"].lower()
            reason = f"Slurm job {acct['job']}: {acct['detail']}, exit code {acct['exit_code']}"
        elif rec is not None:
            state = rec.get("status", "unreadable")
            reason = (rec.get("error") or {}).get("message")
        elif cell.id in running_ids:
            state, reason = "running", None
        elif accounting and cell.index in accounting and accounting[cell.index]["state"] not in ("PENDING", "RUNNING"):
            acct = accounting[cell.index]
            state = "missing" if acct["state"] == "COMPLETED" else acct["state"].lower()
            reason = (f"Slurm job {acct['job']}: {acct['detail']}, exit code {acct['exit_code']}"
                      + (" (ended without writing a result)" if acct["state"] == "COMPLETED" else ""))
        else:
            state, reason = "missing", None
        rows.append({"index": cell.index, "id": cell.id, "state": state,
                     "reason": (reason or "").strip().splitlines()[0][:160] if reason else None,
                     "overrides": " ".join(cell.overrides)})
    return rows


def render(rows: list[dict]) -> str:
    counts = Counter(r["state"] for r in rows)
    lines = [f"{len(rows)} cells: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    for r in rows:
        line = f"  [{r['index']:>3}] {r['id']}  {r['state']:<11} {r['overrides']}"
        lines.append(line + (f"\n        {r['reason']}" if r["reason"] else ""))
    return "\n".join(lines)


def unfinished(rows: list[dict]) -> list[int]:
    """Indices of cells without an ok result (what resume runs again)."""
    return [r["index"] for r in rows if r["state"] != "ok"]
