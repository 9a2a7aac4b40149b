"""`bench project RUN` of a run that saved checkpoints (run.checkpoint): the effective training time
at each world size (ddlbench/metrics/goodput.py) beside the throughput, from what the run measured:
a save's cost to the loop, the restart (measured where the run was restarted after a killed rank:
its `recovery`; else the run's own start-up to its first step, plus reading the checkpoint back: a
resumed run's measured read, else as long as the save took to be durable), and
the mean time to failure at that size (the published fit, or `mttf=DEVICES:HOURS,DEVICES:HOURS`)."""
from __future__ import annotations

from ddlbench.errors import ConfigError
from ddlbench.metrics import goodput as g


def mttf_points(text: str | None):
    """`mttf=1024:8,16384:2` -> ((1024, 28800.0), (16384, 7200.0)); None: the published fit."""
    if not text:
        return g.PUBLISHED_MTTF
    try:
        points = tuple((int(n), float(h) * g.HOUR) for n, h in (p.split(":") for p in text.split(",")))
    except ValueError:
        raise ConfigError(f"mttf={text}: expected DEVICES:HOURS,DEVICES:HOURS (e.g. 1024:8,16384:2)") from None
    if len(points) != 2 or points[0][0] == points[1][0] or min(h for _, h in points) <= 0 or min(n for n, _ in points) < 1:
        raise ConfigError(f"mttf={text}: two points of different device counts, hours > 0")
    return points


def table(rec: dict, rows: list[dict], points=g.PUBLISHED_MTTF) -> dict | None:
    """{inputs, rows: [{devices, mttf_s, interval_s, goodput, goodput_at_run_interval, ...}]} or None
    where the run saved no checkpoint."""
    ck = rec.get("checkpoint") or {}
    if not ck.get("saves") or ck.get("blocked_s_median") is None:
        return None
    written = (ck.get("durable_s_median") or 0.0) - ck["blocked_s_median"]
    cost = g.save_cost(ck["blocked_s_median"], ck.get("slowdown_median"), written)
    startup, read, source = restart_parts(rec, ck)
    restart = startup + read
    out = []
    for r in rows:
        m = g.mttf(r["devices"], points)
        best = g.optimal_interval(cost, m)
        run_interval = ck["every"] * r["step_s"]
        share = g.goodput(best, cost, restart, m)
        out.append({"devices": r["devices"], "mttf_s": m, "interval_s": best, "goodput": share,
                    "run_interval_s": run_interval, "goodput_at_run_interval": g.goodput(run_interval, cost, restart, m),
                    "effective_samples_per_s": r["samples_per_s"] * share})
    return {"save_cost_s": cost, "restart_s": restart, "startup_s": startup, "read_s": read,
            "read_source": source, "mttf_points": [list(p) for p in points],
            "rows": out, "method": "ddlbench/metrics/goodput.py: first order (Young/Daly); the interval is Daly's optimum"}


def restart_parts(rec: dict, ck: dict) -> tuple[float, float, str]:
    """(seconds to a new attempt's state, seconds to read the save, where they come from): a run the
    elastic agent restarted measured both (its `recovery`: detection, relaunch, process group and
    model build; then the restore); else the run's own start-up, and a resumed run's read or, failing
    that, as long as a save took to be durable."""
    r = rec.get("recovery") or {}
    phases = [r.get(k) for k in ("detect_s", "relaunch_s", "process_group_s", "model_build_s")]
    if r.get("restore_s") is not None and all(p is not None for p in phases):
        return sum(phases), r["restore_s"], "both measured: a killed rank's restart (the record's recovery)"
    startup = (rec.get("startup_s") or {}).get("total_to_first_step") or 0.0
    restore = ck.get("restore") or {}
    if restore.get("read_s") is not None:
        return startup, restore["read_s"], "measured (the run resumed)"
    return startup, ck.get("durable_s_median") or 0.0, "assumed as long as a save took to be durable"


def lines(doc: dict) -> list[str]:
    """The goodput table as `bench project` prints it."""
    from ddlbench.record.table import text_table
    head = (f"goodput (checkpoints, failures, restarts): a save costs the loop {doc['save_cost_s']:.3f} s, a restart "
            f"{doc['restart_s']:.1f} s (to a new attempt's state {doc['startup_s']:.1f} s + read {doc['read_s']:.2f} s: "
            f"{doc['read_source']})")
    rows = [[str(r["devices"]), f"{r['mttf_s'] / 3600:.2f}", f"{r['interval_s']:.0f}", f"{r['goodput']:.1%}",
             f"{r['effective_samples_per_s']:,.0f}", f"{r['run_interval_s']:.1f}", f"{r['goodput_at_run_interval']:.1%}"]
            for r in doc["rows"]]
    return [head, text_table(["devices", "MTTF h", "best interval s", "goodput", "effective samples/s",
                              "run's interval s", "goodput then"], rows)]
