"""One training step as a schedule, not a sum (pure; hand-checked in tests/test_schedule.py).

A step is a list of tasks on streams: `compute` (forward and backward of each unit, the optimizer)
and one stream per kind of communication a framework runs beside it (FSDP2's all-gather stream and
its reduce-scatter stream, DDP's all-reduce). Each stream runs its tasks in the order listed, as a
CUDA stream does; a task starts when its stream is free and every task it waits on has finished:

    start(t) = max(end of the task before it on its stream, max(end(d) for d in t.after))

A pool (a stream named `pool:...`: a core or a link several replicas share) runs whichever of its
tasks is ready first instead of the first listed. The step ends when every stream has. Where the compute stream waits on a communication task (its
start is later than the compute before it ended), the gap is that task's exposed time, charged to
its `kind` (e.g. 'all_gather@leaf': the kind and the outermost network dimension its group spans).
The rules of each framework (what waits on what) are in ddlbench/estimate/rules.py.

Shaped links (`bench cluster`'s tbf qdiscs) have a token bucket: a link idle for a while sends up
to its burst at once. `buckets` names each such link and its bucket in seconds of the link's time
(burst bytes / rate); a task naming it in `links` starts with the link's tokens — what it saved up
since the last task on it ended, one second per second idle, capped at the bucket — and runs that
much shorter (never below zero; a task on several links gets the least of their tokens, and draws
that much from each). The step repeats, so the tokens a step starts with are those its last task
on the link left plus the idle time to the step's end (found by repeating the simulation until
they settle). Measured (benchmarks/tbf_probe.py at 100 Mbit/s, reports/network/tbf-probe/): a
256 KiB send 21.9 ms back to back, 17.0 ms after 5 ms idle, 12.0 ms after 20 ms — 5 ms, then the
whole 128 KiB bucket (10.5 ms), saved. Tasks start in time order, so the tokens are spent in the
order the link really carries them.

Except where data goes both ways at once as one message each way — gloo's all-gather (`both_ways`),
or a send while the link's other direction (`>b` / `<b`) is busy — and more than the bucket holds:
then the schedule gives no credit, and the link's saved tokens are gone after it as after any
task longer than them (the link ran at its rate to the end); measured, the buckets help little or not at all
(benchmarks/tbf_probe.py, 100 Mbit/s, 20 ms idle; an all-gather of 256 KiB each way saved 3.8 ms): an
isend/irecv pair of 256 KiB each way 23.4 ms, 21.9 at the line, and an all-gather of 384 KiB
each way 34.8 (32.9), where 128 KiB each way took 1.3 ms (the pair) and 2.7 (the all-gather), of
11.0 at the line; all-reduces (gloo's ring: half the data
each way in each of two phases) and sends one way at a time got the whole bucket. (TCP's
acknowledgements of each direction queue behind the other direction's data in tbf's queue; beyond
~384 KiB each way the exchange runs slower than the line — 45.5 ms for 32.9 —, not priced.)
"""
from __future__ import annotations

from dataclasses import dataclass

COMPUTE = "compute"
POOL = "pool:"      # a stream shared by independent work (a core or a link several replicas use):
                    # it runs whichever of its tasks is ready first, not the first listed


def other_way(key: str) -> str | None:
    """The other direction of a link named by direction ('>0' <-> '<0'); None for a link named
    without one (a collective's dimension: both directions alike)."""
    return {">": "<", "<": ">"}.get(key[:1], "") + key[1:] if key[:1] in "<>" and key else None


@dataclass(frozen=True)
class Task:
    name: str
    stream: str
    seconds: float
    after: tuple[str, ...] = ()
    kind: str = ""          # what its exposed time is charged to ('' = compute)
    links: tuple[str, ...] = ()    # shaped links whose token bucket it draws on (`buckets`)
    both_ways: bool = False        # one message each way at once (gloo's all-gather)


@dataclass(frozen=True)
class Schedule:
    step_s: float
    start: dict             # {task name: start seconds}
    end: dict               # {task name: end seconds}
    busy: dict              # {stream: seconds it ran something}
    exposed: dict           # {kind: seconds the compute stream waited on it}

    @property
    def exposed_s(self) -> float:
        return sum(self.exposed.values())


def simulate(tasks: list[Task], buckets: dict[str, float] | None = None) -> Schedule:
    """Start and end of every task (see the module's docstring). ValueError on a name used twice,
    a wait on an unknown task, or a circle of waits (no stream can go on)."""
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names repeat: {sorted({n for n in names if names.count(n) > 1})[:5]}")
    known = set(names)
    for t in tasks:
        missing = [a for a in t.after if a not in known]
        if missing:
            raise ValueError(f"task {t.name} waits on unknown tasks {missing}")
        if t.seconds < 0:
            raise ValueError(f"task {t.name} has negative seconds {t.seconds}")
    buckets = {k: v for k, v in (buckets or {}).items() if v > 0 and any(k in t.links for t in tasks)}
    tokens = dict(buckets)          # the first pass: every link idle long before the step
    for _ in range(8):
        sched, left = _run(tasks, buckets, tokens)
        settled = {k: min(buckets[k], tok + sched.step_s - last) for k, (tok, last) in left.items()}
        if all(abs(settled[k] - tokens[k]) < 1e-9 for k in settled):
            break
        tokens = settled
    return sched


def _run(tasks: list[Task], buckets: dict[str, float], tokens: dict[str, float]) -> tuple[Schedule, dict]:
    """One pass; tasks started in time order (the earliest start among the streams' ready heads),
    so each link's bucket is drawn in the order the link carries them. Returns the schedule and
    each link's (tokens left, when its last task ended)."""
    queues: dict[str, list[Task]] = {}
    for t in tasks:
        queues.setdefault(t.stream, []).append(t)
    kind = {t.name: t.kind for t in tasks}
    head = {s: 0 for s in queues}
    free = {s: 0.0 for s in queues}
    busy = {s: 0.0 for s in queues}
    link = {k: (tokens[k], 0.0) for k in buckets}
    start, end, exposed = {}, {}, {}
    pending = {s: list(q) for s, q in queues.items() if s.startswith(POOL)}
    for _ in range(len(tasks)):
        ready_heads = []
        for s, q in queues.items():
            for t in pending[s] if s in pending else q[head[s]:head[s] + 1]:
                if all(a in end for a in t.after):
                    ready = max((end[a] for a in t.after), default=0.0)
                    ready_heads.append((max(free[s], ready), ready, s, t))
        if not ready_heads:
            stuck = {s: q[head[s]].name for s, q in queues.items() if head[s] < len(q)}
            raise ValueError(f"the schedule cannot go on: every stream waits ({stuck})")
        at, ready, s, t = min(ready_heads, key=lambda h: h[0])
        if s in pending:
            pending[s].remove(t)
        start[t.name] = at
        if s == COMPUTE and ready > free[s]:
            waited_on = max(t.after, key=lambda a: end[a])
            k = kind[waited_on] or "compute"
            exposed[k] = exposed.get(k, 0.0) + ready - free[s]
        seconds = t.seconds
        keys = [k for k in t.links if k in link]
        if keys:
            saved = {k: min(buckets[k], link[k][0] + max(0.0, at - link[k][1])) for k in keys}
            credit = min(min(saved.values()), seconds)
            both = t.both_ways or any(link.get(other_way(k), (0.0, -1.0))[1] > at for k in keys)
            spent = credit
            if both and seconds > min(buckets[k] for k in keys):
                credit = 0.0        # more than a bucket each way at once: no credit (the module's docstring),
                spent = max(saved.values())   # and the link's tokens gone all the same: it ran at its rate to the end
            seconds -= credit
            for k in keys:
                link[k] = (max(0.0, saved[k] - spent), max(link[k][1], at + seconds))
        end[t.name] = free[s] = at + seconds
        busy[s] += seconds
        head[s] += 1
    step = max(end.values(), default=0.0)
    if COMPUTE in free and step > free[COMPUTE]:    # communication still running after the last compute
        last = max((t for t in tasks if t.stream != COMPUTE), key=lambda t: end[t.name])
        k = last.kind or last.stream
        exposed[k] = exposed.get(k, 0.0) + step - free[COMPUTE]
    return Schedule(step, start, end, busy, exposed), link
