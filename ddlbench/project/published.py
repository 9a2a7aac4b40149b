"""`bench project published=FILE`: a published table, committed as data (benchmarks/published/),
predicted row by row and printed against what was published.

A file holds one source (its url, date, hardware, software, what its figures measure, whether its
memory is the allocator's reserved peak: `memory_is`), `common`
specification arguments, `stacks` (the software recipes its rows ran under, each with the one row
it is calibrated on) and `rows`: each a `bench project` specification at one world size with the
published tokens/s per GPU and memory (GiB) where given; `not_modelled` names what the row used that
the predictor does not price; `unpriced` a row no specification can express yet (with why). A
stack's `attention_as: OTHER` prices its T x T attention matmuls at OTHER's (earlier) calibrated
efficiency, its calibration then solving the rest's (Float8 speeds only the linear layers); its `args`,
`bench project` arguments every row of the stack (its calibration too) is priced with: how the stack runs
what the roofline prices apart (`kernels=eager|fused`, `attention_efficiency=` of its attention kernel).
For each stack the calibration row solves the roofline's efficiency (`calibrate=RATE@WORLD`), every
other row of the stack is predicted with it (`mfu=`); `pairs` are rows that change one knob within
the source, their throughput ratios compared. The arithmetic (`errors`, `pair_ratios`, `summary`)
is pure, hand-checked in tests/test_published.py.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from ddlbench.errors import ConfigError

ROW_KEYS = {"id", "table", "stack", "world", "tokens_per_s", "memory_gib", "spec", "not_modelled", "unpriced"}
FILE_KEYS = {"source", "url", "date", "hardware", "software", "measured", "memory_is", "common", "stacks", "rows",
             "pairs"}


def load(path: Path) -> dict:
    """The suite, checked: every row has an id, a stack that exists, a world, a published rate, and
    a specification unless it says why it is unpriced; every pair and calibration names a row."""
    import yaml
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"published={path}: cannot read it ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not isinstance(doc.get("stacks"), dict):
        raise ConfigError(f"published={path}: needs `stacks` (a mapping) and `rows` (a list)")
    unknown = set(doc) - FILE_KEYS
    if unknown:
        raise ConfigError(f"published={path}: unknown keys {sorted(unknown)} (known: {sorted(FILE_KEYS)})")
    ids = set()
    for i, row in enumerate(doc["rows"]):
        where = f"published={path}: rows[{i}]"
        if not isinstance(row, dict) or set(row) - ROW_KEYS:
            raise ConfigError(f"{where}: a mapping of {sorted(ROW_KEYS)}")
        for key in ("id", "stack", "world", "tokens_per_s"):
            if row.get(key) in (None, ""):
                raise ConfigError(f"{where}: needs {key}")
        if row["id"] in ids:
            raise ConfigError(f"{where}: id {row['id']!r} given twice")
        ids.add(row["id"])
        if row["stack"] not in doc["stacks"]:
            raise ConfigError(f"{where}: stack {row['stack']!r} is not one of {sorted(doc['stacks'])}")
        if not row.get("spec") and not row.get("unpriced"):
            raise ConfigError(f"{where}: needs spec (bench project key=value arguments) or unpriced (why not)")
    if doc.get("memory_is", "allocated") not in ("allocated", "reserved"):
        raise ConfigError(f"published={path}: memory_is must be allocated or reserved (the allocator's reserved peak), "
                          f"got {doc['memory_is']!r}")
    earlier = []
    for name, stack in doc["stacks"].items():
        cal = (stack or {}).get("calibrate")
        row = next((r for r in doc["rows"] if r["id"] == cal), None)
        if row is None or row["stack"] != name or not row.get("spec"):
            raise ConfigError(f"published={path}: stack {name!r} calibrates on {cal!r}, which is not a priced row of it")
        args = stack.get("args") or []
        if not (isinstance(args, list) and all(isinstance(a, str) and "=" in a for a in args)):
            raise ConfigError(f"published={path}: stack {name!r}: args must be a list of bench project key=value "
                              f"arguments, got {args!r}")
        if stack.get("attention_as") is not None and stack["attention_as"] not in earlier:
            raise ConfigError(f"published={path}: stack {name!r}: attention_as must name a stack above it "
                              f"(its efficiency is the attention's here), got {stack['attention_as']!r}")
        earlier.append(name)
    for pair in doc.get("pairs") or []:
        if not (isinstance(pair, list) and len(pair) == 2 and set(pair) <= ids):
            raise ConfigError(f"published={path}: pair {pair!r} must name two rows")
    return doc


def predict(doc: dict, project=None) -> list[dict]:
    """Every row: its stack's calibration row first (efficiency solved), then the rest with that
    efficiency. `project(args) -> projection.json's doc` (default: `bench project` in-process).
    A row the predictor refuses keeps the reason."""
    project = project or _project
    common = list(doc.get("common") or [])
    out, eff, extra = [], {}, {}
    for name, stack in doc["stacks"].items():
        cal = next(r for r in doc["rows"] if r["id"] == stack["calibrate"])
        # attention_as: the T x T attention matmuls run at that (earlier) stack's efficiency: Float8
        # speeds the linear layers only, the calibration solves theirs
        extra[name] = [f"attention_efficiency={eff[stack['attention_as']]!r}"] if stack.get("attention_as") else []
        extra[name] += list(stack.get("args") or [])     # how the stack runs what is priced apart
        got = project([*common, *cal["spec"], f"world_sizes=[{cal['world']}]",
                       f"calibrate={cal['tokens_per_s']}@{cal['world']}", *extra[name]])
        eff[name] = got["efficiency"]
    for row in doc["rows"]:
        res = {k: row.get(k) for k in ("id", "table", "stack", "world", "tokens_per_s", "memory_gib", "not_modelled")}
        res["calibration"] = row["id"] == doc["stacks"][row["stack"]]["calibrate"]
        res["efficiency"] = eff[row["stack"]]
        if row.get("unpriced"):
            res["unpriced"] = row["unpriced"]
            out.append(res)
            continue
        try:
            got = project([*common, *row["spec"], f"world_sizes=[{row['world']}]", f"mfu={eff[row['stack']]!r}",
                           *extra[row["stack"]]])
        except ConfigError as exc:
            res["unpriced"] = f"refused: {exc}"
            out.append(res)
            continue
        r = got["rows"][0]
        mem = r["memory_reserved_per_rank_bytes" if doc.get("memory_is") == "reserved" else "memory_per_rank_bytes"]
        res.update({"predicted_tokens_per_s": r["tokens_per_s_per_device"],
                    "predicted_memory_gib": mem / 2**30 if mem else None, "layout": r.get("layout"),
                    "fits": r.get("fits")})
        out.append(res)
    return errors(out)


def _project(args: list[str]) -> dict:
    """`bench project` in-process, its own table kept off the terminal (one progress line instead)."""
    import contextlib
    import io
    import sys

    from ddlbench.project import spec_command
    with tempfile.TemporaryDirectory(prefix="ddlbench-published-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        spec_command.run([*args, f"out={tmp}"])
        doc = json.loads((Path(tmp) / "projection.json").read_text())
    what = " ".join(a for a in args if a.startswith(("model=", "framework=", "world_sizes=", "calibrate=")))
    print(f"  priced: {what}", file=sys.stderr, flush=True)
    return doc


def errors(rows: list[dict]) -> list[dict]:
    """Each priced row's error (predicted / published - 1) for throughput and, where published,
    memory; rows returned with the fields added."""
    for r in rows:
        if r.get("predicted_tokens_per_s") is not None:
            r["error"] = r["predicted_tokens_per_s"] / r["tokens_per_s"] - 1
            if r.get("memory_gib") and r.get("predicted_memory_gib"):
                r["memory_error"] = r["predicted_memory_gib"] / r["memory_gib"] - 1
    return rows


def pair_ratios(rows: list[dict], pairs: list[list[str]]) -> list[dict]:
    """For each pair [a, b]: the published a/b throughput ratio, the predicted one, and the error
    of the predicted ratio (None where a row is unpriced)."""
    by = {r["id"]: r for r in rows}
    out = []
    for a, b in pairs:
        ra, rb = by[a], by[b]
        pub = ra["tokens_per_s"] / rb["tokens_per_s"]
        pred = (ra["predicted_tokens_per_s"] / rb["predicted_tokens_per_s"]
                if ra.get("predicted_tokens_per_s") and rb.get("predicted_tokens_per_s") else None)
        out.append({"pair": [a, b], "published": pub, "predicted": pred,
                    "error": pred / pub - 1 if pred is not None else None})
    return out


def summary(rows: list[dict], ratios: list[dict]) -> dict:
    """Median and worst |error| over the predicted rows (calibration rows left out: they are exact
    by construction), over memory where published, and over the pairs; how many rows are unpriced; the rows
    whose estimated memory exceeds the device's (`device_memory_gb=`) though they ran."""
    def stats(values):
        values = [abs(v) for v in values]
        return {"n": len(values), "median": statistics.median(values) if values else None,
                "worst": max(values) if values else None}
    predicted = [r for r in rows if r.get("error") is not None and not r["calibration"]]
    return {"throughput": stats(r["error"] for r in predicted),
            "memory": stats(r["memory_error"] for r in rows if r.get("memory_error") is not None),
            "pairs": stats(p["error"] for p in ratios if p["error"] is not None),
            "unpriced": sum(1 for r in rows if r.get("unpriced")),
            # every published row ran: one the estimate says does not fit its device's memory is a wrong prediction
            "not_fitting": [r["id"] for r in rows if r.get("fits") is False]}


def text(doc: dict, rows: list[dict], ratios: list[dict], summ: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{x:+.1%}"
    eff = {r["stack"]: r["efficiency"] for r in rows}
    lines = [f"{doc.get('source')} ({doc.get('date')}); hardware: {doc.get('hardware')}",
             f"memory: the {doc.get('memory_is', 'allocated')} peak per GPU"
             + (" (predicted: the allocated estimate x RESERVED_OVER_ALLOCATED, ddlbench/estimate/memory.py)"
                if doc.get("memory_is") == "reserved" else ""),
             "stacks: " + "; ".join(f"{n} calibrated on {s['calibrate']} (efficiency {eff[n]:.3f} of the peak"
                                    + (f"; attention at {s['attention_as']}'s" if s.get("attention_as") else "")
                                    + "".join(f"; {a}" for a in s.get("args") or []) + ")"
                                    for n, s in doc["stacks"].items()),
             "| row | table | world | published tok/s/GPU | predicted | error | published GiB | predicted | error | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = "calibration" if r["calibration"] else (r.get("unpriced") or
                                                      (f"not modelled: {r['not_modelled']}" if r.get("not_modelled") else ""))
        pred = r.get("predicted_tokens_per_s")
        mem = r.get("predicted_memory_gib")
        lines.append(f"| {r['id']} | {r['table']} | {r['world']} | {r['tokens_per_s']:,} | "
                     f"{'-' if pred is None else f'{pred:,.0f}'} | {pct(r.get('error')) if not r['calibration'] else '-'} | "
                     f"{'-' if not r.get('memory_gib') else r['memory_gib']} | {'-' if mem is None else f'{mem:.1f}'} | "
                     f"{pct(r.get('memory_error'))} | {note} |")
    lines += ["", "| pair | published ratio | predicted | error |", "|---|---|---|---|"]
    for p in ratios:
        pred = "-" if p["predicted"] is None else f"{p['predicted']:.3f}"
        lines.append(f"| {p['pair'][0]} / {p['pair'][1]} | {p['published']:.3f} | {pred} | {pct(p['error'])} |")
    t, m, q = summ["throughput"], summ["memory"], summ["pairs"]
    lines.append(f"\nthroughput: median |error| {pct(t['median'])}, worst {pct(t['worst'])} over {t['n']} predicted rows; "
                 f"memory: median {pct(m['median'])}, worst {pct(m['worst'])} over {m['n']}; pairs: median "
                 f"{pct(q['median'])}, worst {pct(q['worst'])} over {q['n']}; unpriced rows: {summ['unpriced']}")
    if summ.get("not_fitting"):
        lines.append(f"predicted not to fit the device's memory, though they ran: {', '.join(summ['not_fitting'])}")
    return "\n".join(lines)


def run(args: list[str]) -> int:
    """`bench project published=FILE [out=DIR]`: predicts every row, prints the tables, writes
    DIR/published.json (default: published_<file stem>)."""
    from ddlbench.record.results import atomic_write_json
    from ddlbench.settings.keyvalue import parse_key_values
    kv = parse_key_values(args, "bench project", {"published", "out"}, usage="bench project published=FILE [out=DIR]",
                          required=("published",))
    from ddlbench.estimate.profile import profiles_here
    path = Path(kv.text("published"))
    doc = load(path)
    profiles_here()       # this command forks nothing: each model's profile measured here, not in a spawned process
    rows = predict(doc)
    ratios = pair_ratios(rows, doc.get("pairs") or [])
    summ = summary(rows, ratios)
    print(text(doc, rows, ratios, summ))
    out = Path(kv.text("out") or f"published_{path.stem}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "published.json", {"file": str(path), "source": doc.get("source"), "url": doc.get("url"),
                                               "rows": rows, "pairs": ratios, "summary": summ})
    print(f"written: {out / 'published.json'}")
    return 0
