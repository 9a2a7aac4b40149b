"""Communication time on extra, untimed, profiled steps after the window (torch.profiler):
per collective kind, the time it ran, the part overlapped with compute and the exposed part, per
probe period (one step, or a strategy's communication period) and their mean: one step's figure
is a draw of the noise (four runs of one 2-node DDP recorded 14.8 to 37.1 ms for the same
all-reduce, issue 70), so several are profiled and their spread kept.

CPU / gloo: a collective is the `gloo:<kind>` record on gloo's worker thread, from enqueue to
completion (so it includes waiting for the slowest peer); compute is the training thread's
top-level work minus the time it spends in communication calls and waits.
CUDA / NCCL: collectives are the NCCL kernels, compute every other kernel (not yet run on a GPU).
Frameworks whose collectives leave no such record (Horovod's own threads) get None.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

from ddlbench.comm.probe import op_kind
from ddlbench.metrics.overlap import overlap_summary, subtract, union

PERIOD = "ddlbench:period"     # a zero-length marker between profiled periods (never compute)
BLOCKING = ("c10d::", "gloo:", "nccl:", "_c10d_functional", "record_param_comms", "ProfilerStep", PERIOD)
KERNEL_KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                ("broadcast", "broadcast"), ("reduce", "reduce"), ("sendrecv", "send"), ("send", "send"),
                ("recv", "recv"), ("alltoall", "all_to_all"))


def gloo_kind(name: str) -> str | None:
    """'gloo:all_reduce' -> 'all_reduce'; None for anything else."""
    return op_kind(name[5:]) if name.startswith("gloo:") else None


def kernel_kind(name: str) -> str | None:
    """'ncclDevKernel_AllReduce_Sum_f32_RING_LL' -> 'all_reduce'; None for a compute kernel."""
    low = name.lower()
    if "nccl" not in low:
        return None
    for key, kind in KERNEL_KINDS:
        if key in low:
            return kind
    return "other"


def _is_blocking(name: str) -> bool:
    return name.startswith(BLOCKING) or "wait" in name.lower()


def cpu_intervals(events) -> tuple[dict, list]:
    """(comm intervals per kind, compute intervals) in seconds from profiler FunctionEvents."""
    comm: dict[str, list] = {}
    per_thread: dict[int, float] = {}
    for e in events:
        kind = gloo_kind(e.name)
        if kind:
            comm.setdefault(kind, []).append((e.time_range.start / 1e6, e.time_range.end / 1e6))
        elif e.cpu_parent is None and not _is_blocking(e.name):
            per_thread[e.thread] = per_thread.get(e.thread, 0.0) + e.time_range.elapsed_us()
    if not per_thread:
        return comm, []
    main = max(per_thread, key=per_thread.get)   # the training thread: most top-level work
    busy = [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in events
            if e.thread == main and e.cpu_parent is None and not _is_blocking(e.name)]
    blocked = [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in events
               if e.thread == main and _is_blocking(e.name) and not e.name.startswith("ProfilerStep")]
    return comm, subtract(union(busy), blocked)


def cuda_intervals(events) -> tuple[dict, list]:
    comm: dict[str, list] = {}
    compute = []
    for e in events:
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            iv = (e.time_range.start / 1e6, e.time_range.end / 1e6)
            kind = kernel_kind(e.name)
            if kind:
                comm.setdefault(kind, []).append(iv)
            else:
                compute.append(iv)
    return comm, compute


KINETO_NOISE = re.compile(r"^(USDT|STAGE):|.*gpuGetDeviceCount failed")


@contextlib.contextmanager
def quiet_kineto():
    """Kineto writes 'USDT: ... profiler_start/stop' (and, without a GPU, 'ERROR: ...
    gpuGetDeviceCount failed') to fd 2 on every profile: an alarm in every run's log for nothing.
    Hold fd 2 in a file while profiling and pass on every other line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not KINETO_NOISE.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def profile_comm(adapter, batches, device, steps: int, repeats: int = 1) -> dict | None:
    """Run `repeats` periods of `steps` training steps under torch.profiler, a marker between
    periods; the overlap summary per step, the mean over the periods (`split_periods`), and in
    `periods` each period's own summary per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with quiet_kineto():
        with profile(activities=activities) as prof:
            for _ in range(repeats):
                with record_function(PERIOD):
                    pass
                for _ in range(steps):
                    adapter.train_step(next(batches))
                if device.type == "cuda":       # the period's kernels end before the next marker
                    torch.cuda.synchronize(device)
            with record_function(PERIOD):
                pass
        events = prof.events()
    comm, compute = cuda_intervals(events) if device.type == "cuda" else cpu_intervals(events)
    if not comm:
        return None
    marks = sorted(e.time_range.start / 1e6 for e in events if e.name == PERIOD)
    return split_periods(comm, compute, marks, steps)


def split_periods(comm: dict[str, list], compute: list, marks: list[float], steps: int) -> dict:
    """The overlap summary of each period between consecutive `marks` (a collective in the period it
    starts in; compute cut at the marks), per step (/ `steps`), and their mean in the summary's own
    fields; `periods` lists each period's {time_s, exposed_s, kinds: {kind: time_s}}. Pure."""
    bounds = list(zip(marks, marks[1:])) or [(float("-inf"), float("inf"))]
    per = []
    for lo, hi in bounds:
        mine = {k: [iv for iv in ivs if lo <= iv[0] < hi] for k, ivs in comm.items()}
        clipped = [(max(a, lo), min(b, hi)) for a, b in compute if b > lo and a < hi]
        per.append(overlap_summary({k: v for k, v in mine.items() if v}, clipped))
    n = len(per)
    out = {"kinds": {}, "steps": steps, "periods": []}
    for key in ("time_s", "overlapped_s", "exposed_s", "compute_s"):
        out[key] = sum(p[key] for p in per) / n / steps
    for kind in sorted(comm):
        rows = [p["kinds"].get(kind, {}) for p in per]
        out["kinds"][kind] = {key: sum(r.get(key, 0.0) for r in rows) / n / steps
                              for key in ("count", "time_s", "overlapped_s", "exposed_s")}
    for p in per:
        out["periods"].append({"time_s": p["time_s"] / steps, "exposed_s": p["exposed_s"] / steps,
                               "kinds": {k: v["time_s"] / steps for k, v in p["kinds"].items()}})
    return out


TRACE_ROWS = 30


def trace_step(strategy, batches, device, run_dir, rank: int) -> dict:
    """run.trace: one more training step under torch.profiler, after the window (never timed): a
    Chrome trace per rank (trace-rank{r}.json: chrome://tracing or ui.perfetto.dev) and its ops by
    self time (trace-rank{r}.txt), to see where a step goes and whether the device waits on the
    host (gaps between kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with quiet_kineto():
        with profile(activities=activities) as prof:
            strategy.train_step(next(batches))
            if cuda:
                torch.cuda.synchronize(device)
    trace, table = run_dir / f"trace-rank{rank}.json", run_dir / f"trace-rank{rank}.txt"
    prof.export_chrome_trace(str(trace))
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table.write_text(prof.key_averages().table(sort_by=sort, row_limit=TRACE_ROWS) + "\n")
    return {"trace": trace.name, "ops": table.name, "sorted_by": sort}
