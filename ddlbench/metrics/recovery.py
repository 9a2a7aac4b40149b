"""What a failure cost a run that torch's elastic agent restarted (launcher.max_restarts): the record's
`recovery`, from the run's timeline (ddlbench/lifecycle/events.py) and the restarted attempt's steps.

The phases, each ending where the next begins (the slowest rank ends a phase):
  detect_s         the fault fired -> the agent's monitor saw the worker group fail (failure_detected)
  relaunch_s       -> every rank of the new attempt started (the old ones stopped, new ones started)
  process_group_s  -> every rank joined the new process group
  model_build_s    -> every rank's model and optimizer built
  restore_s        -> the newest complete save loaded (`restored`; none: the run started afresh)
  redo_s           -> the new attempt back at the step the fault stopped (its first steps, warm-up and
                      all: the steps trained again since the save)
  lost_s           the fault -> back at its step: the wall clock the failure took from training (the
                   phases' sum; a phase the timeline lacks, None, is inside the next one)
steps_lost = the fault's step - the save's step.
"""
from __future__ import annotations

PHASES = (("detect_s", "failure_detected"), ("relaunch_s", "rank_start"), ("process_group_s", "process_group"),
          ("model_build_s", "model_ready"), ("restore_s", "restored"))


def _attempt(e: dict) -> int:
    return int(e.get("attempt") or 0)


def _latest(evts: list[dict], event: str, attempt: int) -> float | None:
    times = [e["t"] for e in evts if e["event"] == event and _attempt(e) == attempt]
    return max(times) if times else None


def recovery(evts: list[dict], step_s: list[float]) -> dict | None:
    """The last restart's costs; `step_s` = the restarted attempt's step times from its first step
    (global: the slowest rank's per step). None for a run that was not restarted."""
    attempt = max((_attempt(e) for e in evts if e["event"] == "rank_start"), default=0)
    if attempt == 0:
        return None
    fault = next((e for e in evts if e["event"] == "fault" and _attempt(e) == 0), None)
    began = _latest(evts, "restored", 0)       # the first attempt's own resume_from, if any
    first_steps = next((e["step"] for e in evts if e["event"] == "restored" and _attempt(e) == 0), 0) if began else 0
    resumed = next((e["step"] for e in evts if e["event"] == "restored" and _attempt(e) == attempt), 0)
    out = {"attempts": attempt + 1, "fault": None, "resumed_from_step": resumed, "steps_lost": None}
    prev = fault["t"] if fault else None
    if fault:
        out["fault"] = {"rank": fault.get("rank"), "step": first_steps + fault["step"], "kind": fault.get("kind")}
        out["steps_lost"] = out["fault"]["step"] - resumed
    for name, event in PHASES:
        t = _latest(evts, event, attempt - 1 if event == "failure_detected" else attempt)
        if event == "restored" and t is None:     # nothing to restore: the attempt started afresh
            t = prev
        out[name] = None if t is None or prev is None else t - prev
        prev = t if t is not None else prev
    first = _latest(evts, "first_step", attempt)
    lost = out["steps_lost"]
    if first is not None and prev is not None and lost is not None and lost >= 1 and len(step_s) >= lost:
        back = first + sum(step_s[1:lost])     # the first step's end (its time is in the timeline) + the rest
        out["redo_s"] = back - prev
    else:
        out["redo_s"] = 0.0 if lost == 0 else None
    out["lost_s"] = None if fault is None or out["redo_s"] is None else prev + out["redo_s"] - fault["t"]
    out["note"] = ("seconds, each phase ending where the next begins (the slowest rank's): detect = the fault -> "
                   "torch elastic's monitor saw the group fail; relaunch = -> every rank of the new attempt started; "
                   "process_group, model_build, restore (the newest complete save loaded) = -> each done on every "
                   "rank; redo = -> the new attempt back at the fault's step (steps_lost = fault step - the save's "
                   "step, trained again); lost_s = the fault -> back at its step (the phases' sum; a phase not seen, "
                   "None, is in the next one's). The timing figures above are the last attempt's")
    return out


def recovery_warning(rec: dict | None) -> list[str]:
    """The record's warning for a restarted run (its figures are the last attempt's)."""
    if not rec:
        return []
    fault = rec["fault"] or {}
    what = (f"rank {fault.get('rank')} failed ({fault.get('kind')}, injected) at step {fault.get('step')}"
            if fault else "a rank failed")
    lost = f"{rec['lost_s']:.2f} s" if rec["lost_s"] is not None else "unknown time"
    return [f"the run was restarted ({rec['attempts'] - 1} time(s)): {what}; it resumed from step "
            f"{rec['resumed_from_step']} ({rec['steps_lost']} step(s) trained again), {lost} lost in all "
            "(result.json: recovery); the timing figures are the last attempt's"]
