"""`bench context ...`: the longest sequence a layout fits on a device (issue 51). The estimator
first (ddlbench/estimate/memory.py, the estimate run.micro_batch=auto and bench advise use): every
candidate `model.seq_len` planned as a run would be and its busiest rank's peak estimated; the
longest whose estimate fits the device is the answer. Then, with measure=true (default), the
answer is held against the device: a run at it, which should end `ok`, and one at the next
candidate, which should end `oom` cleanly (on a CPU the device is `run.device_memory_gb`, enforced by
the memory tracker: ddlbench/rank/memtrack.py; on a GPU by the capped allocator). Writes context.json and
context.png (estimated and measured peak memory and tokens/s against the sequence length) and the
runs under runs/ (`bench report OUT/runs` reads them like any)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddlbench.errors import ConfigError
from ddlbench.lifecycle.signals import run_child
from ddlbench.record.results import atomic_write_json

KEYS = {"seq_lens", "measure", "out", "replace"}
USAGE = ("usage: bench context model=NAME framework=NAME launcher.nproc=N run.device_memory_gb=X "
         "[seq_lens=[128,256,...]] [measure=true|false] [out=DIR] [replace=true] [any run override]")
GROWTH = 6          # default candidates: the preset's length x 2^0 .. 2^GROWTH
MAX_SEQ_LEN = 1 << 22   # 4,194,304 tokens: past any model's context here; 1e10 tried to build an 80 GB batch
MAX_CANDIDATES = 64


def candidates(base: int, given: list[int] | None) -> list[int]:
    """The sequence lengths to try, ascending: as given, else the preset's doubled up to 64x."""
    return sorted(set(given)) if given else [base * 2 ** k for k in range(GROWTH + 1)]


def longest(estimates: list[tuple[int, int | None]], limit: int) -> int | None:
    """The longest sequence whose estimate fits `limit` bytes, counting up from the shortest until
    one does not fit (None: not even the shortest fits; an unplannable length ends the search)."""
    best = None
    for seq, need in sorted(estimates):
        if need is None or need > limit:
            break
        best = seq
    return best


def estimate_all(overrides: list[str], seqs: list[int]) -> tuple[list[dict], int, str]:
    """[{'seq_len', 'estimate_bytes' | None, 'why' (where it cannot be planned)}], the device's
    bytes and where that figure comes from."""
    from ddlbench.estimate.memcheck import predicted
    from ddlbench.machine.device import planned_device
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.planning.microbatch import device_limit
    rows, limit, source = [], None, ""
    for seq in seqs:
        try:
            plan = plan_from_overrides([*overrides, f"model.seq_len={seq}"])
        except ConfigError as exc:
            rows.append({"seq_len": seq, "estimate_bytes": None, "why": str(exc)})
            continue
        device = planned_device(plan.cfg.run.device)
        if limit is None:
            limit, source = device_limit(plan.cfg.run, device, plan.cfg.launcher.nproc)
        try:
            rows.append({"seq_len": seq, "estimate_bytes": int(predicted(plan, device=device)["total"])})
        except ValueError as exc:
            raise ConfigError(f"bench context: {exc}") from None
    if limit is None:
        raise ConfigError(f"bench context: no candidate length can be planned: {rows[0]['why'] if rows else '-'}")
    return rows, limit, source


def measure(overrides: list[str], seq: int, out: Path) -> dict:
    """One `bench run` at this length (its own process, its own run directory): status, peak, speed."""
    run_dir = out / "runs" / f"seq_{seq}"
    # a stop signal to `bench context` stops this run through its launcher and waits for it
    run_child([sys.executable, "-m", "ddlbench.cli", "run", *overrides, f"model.seq_len={seq}",
               f"run.dir={run_dir}", "logger=none", "run.progress=false"], f"the run at seq_len {seq}",
              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from ddlbench.record.rundir import RunDir
    path = RunDir(run_dir).result
    if not path.is_file():
        return {"seq_len": seq, "status": "no result", "run_dir": str(run_dir)}
    rec = json.loads(path.read_text())
    trackers = [r.get("tracker") for r in (rec.get("memory") or {}).get("per_rank", []) if r.get("tracker")]
    peaks = [r.get("peak_allocated_bytes") for r in (rec.get("memory") or {}).get("per_rank", [])]
    peak = max((t["peak_bytes"] for t in trackers), default=None) or max((p for p in peaks if p), default=None)
    return {"seq_len": seq, "status": rec["status"], "run_dir": str(run_dir), "peak_bytes": peak,
            "tokens_per_s": (rec.get("throughput") or {}).get("tokens_per_s"),
            "error": ((rec.get("error") or {}).get("message") or "")[:300] or None}


def run(args: list[str]) -> int:
    from ddlbench.settings.keyvalue import parse_key_values
    kv = parse_key_values(args, "bench context", KEYS, usage=USAGE,
                          passes=lambda k: k in ("model", "framework") or "." in k or k.startswith("+"),
                          passes_hint="run overrides: model=, framework=, launcher.*, run.*, framework.options.*")
    overrides = list(kv.passed)
    if not any(a.startswith("model=") for a in overrides):
        raise ConfigError(f"bench context: model= is required\n{USAGE}")
    if any(a.startswith("model.seq_len=") for a in overrides):
        raise ConfigError("bench context: it sets model.seq_len itself; give the lengths to try as seq_lens=[...]")
    from ddlbench.planning.config import plan_from_overrides
    base = plan_from_overrides(overrides).cfg.model
    if getattr(base, "seq_len", None) is None:
        raise ConfigError(f"bench context: {base.name} has no sequence (a language model is needed)")
    given = kv.integers("seq_lens")
    too_long = [s for s in given or () if s > MAX_SEQ_LEN]
    if too_long:
        raise ConfigError(f"bench context: seq_lens {too_long} exceed {MAX_SEQ_LEN:,} tokens (the example batch "
                          "alone would not fit a host)")
    if given is not None and len(set(given)) > MAX_CANDIDATES:
        raise ConfigError(f"bench context: at most {MAX_CANDIDATES} seq_lens, got {len(set(given))}")
    seqs = candidates(base.seq_len, given)
    from ddlbench.lifecycle.ownership import claim_output
    # before any work: a file in its place, or files ddlbench did not write, said now, not after the runs
    out = claim_output(Path(kv.text("out") or f"context_{base.name}"), "bench context", ["context.json", "context.png"],
                       "pass replace=true", kv.choice("replace", ("true", "false"), "false") == "true")
    rows, limit, source = estimate_all(overrides, seqs)
    answer = longest([(r["seq_len"], r["estimate_bytes"]) for r in rows], limit)
    measured = []
    if kv.choice("measure", ("true", "false"), "true") == "true":
        at = [answer] if answer is not None else []
        past = [s for s in seqs if answer is None or s > answer][:1]
        measured = [measure(overrides, s, out) for s in at + past]
    doc = {"overrides": overrides, "device_memory_bytes": limit, "device_memory_source": source,
           "longest_seq_len": answer, "estimates": rows, "measured": measured,
           "estimator": "ddlbench/estimate/memory.py (the busiest rank's peak, the variant's cost model, the meta profile)"}
    atomic_write_json(out / "context.json", doc)
    plot(doc, out / "context.png")
    report(doc, out)
    return 0


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gib = 2 ** 30
    est = [(r["seq_len"], r["estimate_bytes"] / gib) for r in doc["estimates"] if r["estimate_bytes"] is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    if est:
        a.plot(*zip(*est), "o-", label="estimated peak (busiest rank)")
    meas = [(m["seq_len"], m["peak_bytes"] / gib, m["status"]) for m in doc["measured"] if m.get("peak_bytes")]
    for s, p, st in meas:
        a.plot([s], [p], "s", color="green" if st == "ok" else "red", label=f"measured ({st})")
    a.axhline(doc["device_memory_bytes"] / gib, ls="--", color="gray", label="device memory")
    a.set_xscale("log", base=2), a.set_yscale("log"), a.set_xlabel("sequence length"), a.set_ylabel("GiB")
    a.legend(fontsize=7)
    speed = [(m["seq_len"], m["tokens_per_s"]) for m in doc["measured"] if m.get("tokens_per_s")]
    if speed:
        b.plot(*zip(*speed), "o-")
    b.set_xscale("log", base=2), b.set_xlabel("sequence length"), b.set_ylabel("tokens/s (measured runs)")
    fig.suptitle(" ".join(o for o in doc["overrides"] if o.startswith(("model=", "framework=", "framework.options."))),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc: dict, out: Path) -> None:
    from ddlbench.record.table import text_table
    gib = 2 ** 30
    measured = {m["seq_len"]: m for m in doc["measured"]}
    print(f"{' '.join(doc['overrides'])}: device {doc['device_memory_bytes'] / gib:.3f} GiB ({doc['device_memory_source']})")
    print(text_table(["seq_len", "estimated peak GiB", "fits (estimate)", "measured", "measured peak GiB",
                      "tokens/s (under the tracker on a CPU)"],
                     [[str(r["seq_len"]),
                       "-" if r["estimate_bytes"] is None else f"{r['estimate_bytes'] / gib:.3f}",
                       "-" if r["estimate_bytes"] is None else ("yes" if r["estimate_bytes"] <= doc["device_memory_bytes"] else "no"),
                       measured.get(r["seq_len"], {}).get("status", ""),
                       f"{measured[r['seq_len']]['peak_bytes'] / gib:.3f}" if measured.get(r["seq_len"], {}).get("peak_bytes") else "",
                       f"{measured[r['seq_len']]['tokens_per_s']:,.0f}" if measured.get(r["seq_len"], {}).get("tokens_per_s") else ""]
                      for r in doc["estimates"]]))
    answer = doc["longest_seq_len"]
    print(f"longest sequence that fits (estimate): {answer if answer is not None else 'none of the candidates'}")
    for m in doc["measured"]:
        print(f"  measured at {m['seq_len']}: {m['status']}" + (f" ({m['error']})" if m.get("error") and m["status"] != "ok" else ""))
    for name in ("context.json", "context.png"):
        print(f"  {out / name}")
