"""One training step as a schedule, not a sum (pure; hand-checked in tests/test_schedule.py).

A step is a list of tasks on streams: `compute` (forward and backward of each unit, the optimizer)
and one stream per kind of communication a framework runs beside it (FSDP2's all-gather stream and
its reduce-scatter stream, DDP's all-reduce). Each stream runs its tasks in the order listed, as a
CUDA stream does; a task starts when its stream is free and every task it waits on has finished:

    start(t) = max(end of the task before it on its stream, max(end(d) for d in t.after))

The step ends when every stream has. Where the compute stream waits on a communication task (its
start is later than the compute before it ended), the gap is that task's exposed time, charged to
its `kind` (e.g. 'all_gather@leaf': the kind and the outermost network dimension its group spans).
The rules of each framework (what waits on what) are in ddlbench/estimate/rules.py.
"""
from __future__ import annotations

from dataclasses import dataclass

COMPUTE = "compute"


@dataclass(frozen=True)
class Task:
    name: str
    stream: str
    seconds: float
    after: tuple[str, ...] = ()
    kind: str = ""          # what its exposed time is charged to ('' = compute)


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


def simulate(tasks: list[Task]) -> Schedule:
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
    queues: dict[str, list[Task]] = {}
    for t in tasks:
        queues.setdefault(t.stream, []).append(t)
    kind = {t.name: t.kind for t in tasks}
    head = {s: 0 for s in queues}
    free = {s: 0.0 for s in queues}
    busy = {s: 0.0 for s in queues}
    start, end, exposed = {}, {}, {}
    left = len(tasks)
    while left:
        progressed = False
        for s, q in queues.items():
            while head[s] < len(q) and all(a in end for a in q[head[s]].after):
                t = q[head[s]]
                ready = max((end[a] for a in t.after), default=0.0)
                start[t.name] = max(free[s], ready)
                if s == COMPUTE and ready > free[s]:
                    waited_on = max(t.after, key=lambda a: end[a])
                    k = kind[waited_on] or "compute"
                    exposed[k] = exposed.get(k, 0.0) + ready - free[s]
                end[t.name] = free[s] = start[t.name] + t.seconds
                busy[s] += t.seconds
                head[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            stuck = {s: q[head[s]].name for s, q in queues.items() if head[s] < len(q)}
            raise ValueError(f"the schedule cannot go on: every stream waits ({stuck})")
    step = max(end.values(), default=0.0)
    if COMPUTE in free and step > free[COMPUTE]:    # communication still running after the last compute
        last = max((t for t in tasks if t.stream != COMPUTE), key=lambda t: end[t.name])
        k = last.kind or last.stream
        exposed[k] = exposed.get(k, 0.0) + step - free[COMPUTE]
    return Schedule(step, start, end, busy, exposed)
