"""Each framework's step as tasks for the schedule (ddlbench/estimate/schedule.py): what waits on
what (pure; hand-checked in tests/test_schedule.py). Times come in already priced: a piece's
forward and backward seconds per micro-batch, each unit's collectives' seconds.

FSDP2 (fully_shard per block, the rest in the root unit; ZeRO-3 alike): forward all-gathers each
unit on its own stream one unit ahead (the all-gather of unit k waits until unit k-2's forward
is done: two units gathered at most); backward all-gathers the resharded units again, one ahead,
and reduce-scatters each unit's gradients on a second stream once its last piece's backward is
done (HSDP: then all-reduces the shard across the replicas on that stream); the root unit is not
resharded after forward. With gradient accumulation, the all-gathers repeat every micro-batch
and the reduction comes once, after the last. The optimizer waits for every reduction.
DDP: gradients all-reduced in buckets (bucket_bytes, 25 MiB) in backward order, each once its last
piece's backward is done, on the last micro-batch only (no_sync on the others).
ZeRO-1/2: gradients all-reduced in buckets the same way (DeepSpeed 0.19's
use_multi_rank_bucket_allreduce; stage 2 on every micro-batch); after the optimizer the updated
parameters are all-gathered (nothing left to hide them behind).
On a device without streams (CPU), FSDP2 blocks on every collective where it issues it
(fsdp_blocking): nothing overlaps.
Tensor parallelism: a block's forward waits on its activations' all-reduces (two a block, Megatron's
f/g), and so does its backward: exposed, on a stream of their own so the schedule names them.
Pipelines (GPipe, 1F1B one stage a rank; interleaved 1F1B v stages a rank, in a loop): each rank a
compute stream running its micro-batches' forwards and backwards in the schedule's order, each
boundary between ranks two links (activations forward, their gradients back), each send on its
direction's stream; after the schedule the stages' tied copies summed (the first and the last
stage), then each rank's data-parallel all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from ddlbench.estimate.schedule import COMPUTE, Task
from ddlbench.metrics.pipeline import interleaved_order


@dataclass(frozen=True)
class Piece:
    name: str
    unit: str               # the FSDP unit (or DDP bucket member) it belongs to
    forward_s: float        # per micro-batch
    backward_s: float       # per micro-batch, recompute included
    params: float = 0.0     # for DDP's / ZeRO's buckets (gradient bytes come from `grad_bytes`)
    tp_forward_s: float = 0.0    # its tensor-parallel collectives' seconds in forward
    tp_backward_s: float = 0.0


@dataclass(frozen=True)
class Unit:
    name: str
    gather_s: float = 0.0    # all-gather of its parameters
    scatter_s: float = 0.0   # reduce-scatter of its gradients
    reduce_s: float = 0.0    # all-reduce of its gradient shard across replicas (HSDP)
    resharded: bool = True   # gathered again for backward


def _forward_backward(pieces: list[Piece], mb: int, gate_f, gate_b, tp_kind: str) -> tuple[list[Task], dict]:
    """One micro-batch's compute (and TP) tasks; gate_f / gate_b(piece) -> what its compute waits
    on besides the compute before it. Returns the tasks and {piece: its backward task}."""
    tasks, back, prev = [], {}, ()
    for p in pieces:
        f = f"F{mb}:{p.name}"
        tasks.append(Task(f, COMPUTE, p.forward_s, prev + gate_f(p)))
        prev = ()
        if p.tp_forward_s:
            tasks.append(Task(f"TPf{mb}:{p.name}", "tp", p.tp_forward_s, (f,), tp_kind))
            prev = (f"TPf{mb}:{p.name}",)
    for p in reversed(pieces):
        b = f"B{mb}:{p.name}"
        tasks.append(Task(b, COMPUTE, p.backward_s, prev + gate_b(p)))
        back[p.name] = b
        prev = ()
        if p.tp_backward_s:
            tasks.append(Task(f"TPb{mb}:{p.name}", "tp", p.tp_backward_s, (b,), tp_kind))
            prev = (f"TPb{mb}:{p.name}",)
            back[p.name] = f"TPb{mb}:{p.name}"
    return tasks, back


def fsdp(pieces: list[Piece], units: list[Unit], grad_accum: int, optimizer_s: float, kinds: dict,
         tp_kind: str = "tp", blocking: bool = False) -> list[Task]:
    """kinds: {'gather', 'scatter', 'reduce'}: the names their exposed time is charged to.
    blocking: a device without streams (CPU): see fsdp_blocking."""
    if blocking:
        return fsdp_blocking(pieces, units, grad_accum, optimizer_s, kinds, tp_kind)
    by_name = {u.name: u for u in units}
    order_f = list(dict.fromkeys(p.unit for p in pieces))             # first use in forward
    order_b = list(dict.fromkeys(p.unit for p in reversed(pieces)))   # first use in backward
    last_b = {u: next(p.name for p in pieces if p.unit == u) for u in order_b}   # its last backward piece
    first_f = {u: next(p.name for p in pieces if p.unit == u) for u in order_f}
    backward = list(reversed(pieces))
    first_b = {u: next(p.name for p in backward if p.unit == u) for u in order_b}
    tasks = []
    for mb in range(grad_accum):
        last = mb == grad_accum - 1
        ag_f = {}
        for k, u in enumerate(order_f):
            # issued as the unit before it starts its forward: after the piece before that unit
            before = _before(pieces, first_f[order_f[k - 1]]) if k >= 1 else None
            after = (f"F{mb}:{before}",) if before else ()
            if by_name[u].gather_s and (mb == 0 or by_name[u].resharded):
                ag_f[u] = f"AGf{mb}:{u}"
                tasks.append(Task(ag_f[u], "all_gather", by_name[u].gather_s, after, kinds["gather"]))
        ag_b = {}
        for k, u in enumerate(order_b):
            if not (by_name[u].gather_s and by_name[u].resharded):
                continue
            before = _before(backward, first_b[order_b[k - 1]]) if k >= 1 else None
            after = (f"B{mb}:{before}",) if before else (f"F{mb}:{_last_piece(pieces, u)}",)
            ag_b[u] = f"AGb{mb}:{u}"
            tasks.append(Task(ag_b[u], "all_gather", by_name[u].gather_s, after, kinds["gather"]))

        def gate_f(p, ag=ag_f, mb=mb):
            return (ag[p.unit],) if p.name == first_f[p.unit] and p.unit in ag else ()

        def gate_b(p, ag=ag_b):
            return (ag[p.unit],) if p.name == first_b[p.unit] and p.unit in ag else ()

        compute, back = _forward_backward(pieces, mb, gate_f, gate_b, tp_kind)
        tasks += compute
        if last:
            waits = []
            ready = sorted(order_b, key=lambda u: [q.name for q in backward].index(last_b[u]))
            for u in ready:         # the reduce-scatter stream takes them as their gradients are done
                unit = by_name[u]
                if unit.scatter_s or unit.reduce_s:
                    prev = back[last_b[u]]
                    if unit.scatter_s:
                        tasks.append(Task(f"RS:{u}", "reduce_scatter", unit.scatter_s, (prev,), kinds["scatter"]))
                        prev = f"RS:{u}"
                    if unit.reduce_s:
                        tasks.append(Task(f"AR:{u}", "reduce_scatter", unit.reduce_s, (prev,), kinds["reduce"]))
                        prev = f"AR:{u}"
                    waits.append(prev)
            tasks.append(Task("optimizer", COMPUTE, optimizer_s, tuple(waits)))
    return tasks


def fsdp_blocking(pieces: list[Piece], units: list[Unit], grad_accum: int, optimizer_s: float, kinds: dict,
                  tp_kind: str = "tp") -> list[Task]:
    """FSDP2 on a device without streams (CPU): its "streams" are the current one and every
    collective is issued with async_op=False, so the host waits for each where FSDP2's hooks issue
    it — a unit's all-gather just before its first piece runs (forward; backward again where it
    was resharded), its reduce-scatter (then HSDP's all-reduce) right after its last piece's
    backward on the last micro-batch — and nothing overlaps: one chain of tasks, each after the one
    before (measured on `bench cluster`: FSDP2's step at 2 ranks is its compute plus every
    collective's time, docs/projection.md)."""
    by_name = {u.name: u for u in units}
    backward = list(reversed(pieces))
    first_f = {u: next(p.name for p in pieces if p.unit == u) for u in by_name}
    first_b = {u: next(p.name for p in backward if p.unit == u) for u in by_name}
    last_b = {u: next(p.name for p in pieces if p.unit == u) for u in by_name}
    tasks: list[Task] = []

    def then(name: str, stream: str, seconds: float, kind: str = "") -> None:
        tasks.append(Task(name, stream, seconds, (tasks[-1].name,) if tasks else (), kind))
        if stream != COMPUTE:    # the host resumes once it is done: its wait is charged to its own kind
            tasks.append(Task(f"{name}.waited", COMPUTE, 0.0, (name,)))

    for mb in range(grad_accum):
        last = mb == grad_accum - 1
        for p in pieces:
            u = by_name.get(p.unit)
            if u and u.gather_s and p.name == first_f[p.unit] and (mb == 0 or u.resharded):
                then(f"AGf{mb}:{p.unit}", "all_gather", u.gather_s, kinds["gather"])
            then(f"F{mb}:{p.name}", COMPUTE, p.forward_s)
            if p.tp_forward_s:
                then(f"TPf{mb}:{p.name}", "tp", p.tp_forward_s, tp_kind)
        for p in backward:
            u = by_name.get(p.unit)
            if u and u.gather_s and u.resharded and p.name == first_b[p.unit]:
                then(f"AGb{mb}:{p.unit}", "all_gather", u.gather_s, kinds["gather"])
            then(f"B{mb}:{p.name}", COMPUTE, p.backward_s)
            if p.tp_backward_s:
                then(f"TPb{mb}:{p.name}", "tp", p.tp_backward_s, tp_kind)
            if last and u and p.name == last_b[p.unit]:
                if u.scatter_s:
                    then(f"RS:{p.unit}", "reduce_scatter", u.scatter_s, kinds["scatter"])
                if u.reduce_s:
                    then(f"AR:{p.unit}", "reduce_scatter", u.reduce_s, kinds["reduce"])
    then("optimizer", COMPUTE, optimizer_s)
    return tasks


def _before(order: list[Piece], name: str) -> str | None:
    """The piece before `name` in `order` (None for the first)."""
    i = next(i for i, p in enumerate(order) if p.name == name)
    return order[i - 1].name if i else None


def _last_piece(pieces: list[Piece], unit: str) -> str:
    return [p.name for p in pieces if p.unit == unit][-1]


def buckets(pieces: list[Piece], grad_bytes: float, bucket_bytes: float) -> list[tuple[str, float]]:
    """DDP's (or ZeRO's) gradient buckets in backward order: [(the piece whose backward completes
    it, its bytes)]; a bucket closes once it holds bucket_bytes (the last one with what is left)."""
    out, size = [], 0.0
    for p in reversed(pieces):
        size += p.params * grad_bytes
        if size >= bucket_bytes:
            out.append((p.name, size))
            size = 0.0
    if size > 0:
        out.append((pieces[0].name, size))
    return out


def bucketed(pieces: list[Piece], bucket_s: list[tuple[str, float]], grad_accum: int, optimizer_s: float,
             kind: str, stream: str, after_optimizer: tuple[float, str] | None = None,
             tp_kind: str = "tp", every_micro_batch: bool = False) -> list[Task]:
    """DDP (all-reduce buckets on the last micro-batch) or ZeRO-1/2 (DeepSpeed 0.19 all-reduces its
    buckets: at the accumulation boundary for stage 1, `every_micro_batch` for stage 2; then the
    parameters' all-gather after the optimizer: `after_optimizer` = (seconds, kind)). bucket_s:
    [(piece whose backward closes the bucket, seconds of its collective)]."""
    tasks, none, waits = [], (lambda p: ()), []
    for mb in range(grad_accum):
        compute, back = _forward_backward(pieces, mb, none, none, tp_kind)
        tasks += compute
        if every_micro_batch or mb == grad_accum - 1:
            for i, (piece, seconds) in enumerate(bucket_s):
                tasks.append(Task(f"{stream}{mb}.{i}", stream, seconds, (back[piece],), kind))
                waits.append(f"{stream}{mb}.{i}")
    tasks.append(Task("optimizer", COMPUTE, optimizer_s, tuple(waits)))
    if after_optimizer:
        tasks.append(Task("AG:parameters", "all_gather", after_optimizer[0], ("optimizer",), after_optimizer[1]))
    return tasks


def pipeline(stage_s: list[tuple[float, float]], micro_batches: int, send_s: float, schedule: str,
             send_kind: str, tied: tuple[float, str] | None = None,
             reduce: list[tuple[float, str]] | None = None, replicas: int = 1,
             stages_per_rank: int = 1) -> list[Task]:
    """A one-stage-per-rank pipeline as torch.distributed.pipelining runs it. stage_s: (forward,
    backward) seconds per micro-batch of each stage; send_s: one boundary send (either way); tied:
    (seconds, kind) of the tied weight's all-reduce between the first and the last stage; reduce:
    each stage's data-parallel all-reduce (seconds, kind). Sends go on the links `>b` (activations
    over boundary b) and `<b` (their gradients back), a stream each (one message at a time), and
    count as done when delivered; a stage waits where torch's schedule waits (zero-second markers
    on its stream):
    - GPipe: each forward waits for its input, its output's send is issued and not waited on
      until every forward is done; the backwards alike, every send waited on at the end.
    - 1F1B (Schedule1F1B): min(m, pp - stage) forwards first, each waiting for the send before it;
      the last of them is sent together with the first backward's receive and both are waited on;
      then backward, and (while forwards are left) the backward's send waited on together with
      the next forward's receive, then that forward; the backwards left each wait for their
      gradient, and the send before theirs; the last send is waited on at the end.
    replicas > 1: that many data-parallel replicas simulated side by side, sharing each stage's
    processor and each boundary's links (`bench cluster` on a small host: a node's devices share its
    one core and its link): a shared stream serves whichever of their tasks is ready first
    (schedule.POOL), each at the whole processor's or link's speed; each replica's tasks stay in
    their own order. The data-parallel all-reduce of a stage waits for every replica.
    interleaved_1f1b (stages_per_rank v > 1): stage_s lists the pp x v stages, stage k on rank k mod pp;
    see `interleaved`. `reduce` is then per rank."""
    m, v = micro_batches, stages_per_rank
    pp = len(stage_s) // v
    if schedule == "interleaved_1f1b":
        one = interleaved(stage_s, pp, m, send_s, send_kind)
    else:
        one = [t for s in range(pp) for t in _stage(s, pp, m, *stage_s[s], send_s, send_kind, schedule)]
    tasks = one if replicas == 1 else [t for r in range(replicas) for t in _replica(one, r)]
    tags = [f"#{r}" for r in range(replicas)] if replicas > 1 else [""]
    done = {s: [next(t.name for t in reversed(one) if t.stream == f"stage{s}") + tag for tag in tags] for s in range(pp)}
    if tied and pp > 1:     # one all-reduce between the first and the last stage, on both directions' links
        links = (">0", "<0") if pp == 2 else ()
        for r, tag in enumerate(tags):
            tasks.append(Task(f"tied{tag}", f"tied{tag}", tied[0], (done[0][r], done[pp - 1][r]), tied[1], links))
            done[0][r] = done[pp - 1][r] = f"tied{tag}"
    for s, (seconds, kind) in enumerate(reduce or []):
        if seconds > 0:
            tasks.append(Task(f"AR{s}", f"reduce{s}", seconds, tuple(dict.fromkeys(done[s])), kind,
                              (f"{kind.partition('@')[2]}:{s}",)))
    return tasks


def interleaved(stage_s: list[tuple[float, float]], pp: int, m: int, send_s: float, send_kind: str) -> list[Task]:
    """Interleaved 1F1B's tasks: each rank's stream `stage{r}` runs `interleaved_order`; a forward
    waits for its input (stage k-1's output, sent over the link from rank k-1 mod pp: `>b` with b
    the sender's rank, b = pp - 1 the wrap-around to rank 0), a backward for its gradient (`<b`, b
    the receiving rank) or, on the last stage, for its own forward. torch's runtime posts sends
    without waiting and waits for every one of them at the end of the step (a zero-second marker
    on the rank's stream); each link carries its sender's messages in the order they are made."""
    n = len(stage_s)
    tasks: list[Task] = []
    for r in range(pp):
        sent = []
        for kind, k, i in interleaved_order(r, pp, n // pp, m):
            f, b = stage_s[k]
            if kind == "F":
                tasks.append(Task(f"F{k}.{i}", f"stage{r}", f, (f"S>{k - 1}.{i}",) if k else ()))
                if k < n - 1:
                    sent.append(f"S>{k}.{i}")
                    tasks.append(Task(sent[-1], f">{r}", send_s, (f"F{k}.{i}",), send_kind, (f">{r}",)))
            else:
                tasks.append(Task(f"B{k}.{i}", f"stage{r}", b, (f"S<{k}.{i}",) if k < n - 1 else (f"F{k}.{i}",)))
                if k:
                    to = (k - 1) % pp
                    sent.append(f"S<{k - 1}.{i}")
                    tasks.append(Task(sent[-1], f"<{to}", send_s, (f"B{k}.{i}",), send_kind, (f"<{to}",)))
        if sent:
            tasks.append(Task(f"stage{r}.sent", f"stage{r}", 0.0, tuple(sent)))
    return tasks


def _replica(tasks: list[Task], r: int) -> list[Task]:
    """Replica r's copy of one pipeline's tasks on the shared streams: names tagged `#r`, each
    stage's and each link's stream a pool, each task also waiting for the one before it on its
    stream in this replica (a pool serves tasks in the order they become ready, not as listed)."""
    from dataclasses import replace

    from ddlbench.estimate.schedule import POOL
    last: dict[str, str] = {}
    out = []
    for t in tasks:
        before = (last[t.stream],) if t.stream in last else ()
        out.append(replace(t, name=f"{t.name}#{r}", stream=POOL + t.stream,
                           after=tuple(f"{a}#{r}" for a in t.after) + before))
        last[t.stream] = f"{t.name}#{r}"
    return out


def _stage(s: int, pp: int, m: int, f: float, b: float, send_s: float, send_kind: str, schedule: str) -> list[Task]:
    """Stage s's tasks (see pipeline): its compute and wait markers on `stage{s}`, its sends on the links."""
    tasks: list[Task] = []
    stream, marks, last = f"stage{s}", count(), s == pp - 1

    def recv_f(i):              # the activations its forward i needs
        return (f"S>{s - 1}.{i}",) if s else ()

    def recv_b(i):              # the gradient its backward i needs
        return () if last else (f"S<{s}.{i}",)

    def sent_f(i):              # its forward i's send
        return () if last or i < 0 else (f"S>{s}.{i}",)

    def sent_b(i):              # its backward i's send
        return (f"S<{s - 1}.{i}",) if s and i >= 0 else ()

    def wait(on):
        if on:
            tasks.append(Task(f"{stream}.wait{next(marks)}", stream, 0.0, tuple(on)))

    def forward(i):
        tasks.append(Task(f"F{s}.{i}", stream, f, recv_f(i)))
        if not last:
            tasks.append(Task(f"S>{s}.{i}", f">{s}", send_s, (f"F{s}.{i}",), send_kind, (f">{s}",)))

    def backward(i):
        tasks.append(Task(f"B{s}.{i}", stream, b, recv_b(i) or (f"F{s}.{i}",)))
        if s:
            tasks.append(Task(f"S<{s - 1}.{i}", f"<{s - 1}", send_s, (f"B{s}.{i}",), send_kind, (f"<{s - 1}",)))

    if schedule == "gpipe":
        for i in range(m):
            forward(i)
        wait([x for i in range(m) for x in sent_f(i)])
        for i in range(m):
            backward(i)
        wait([x for i in range(m) for x in sent_b(i)])
        return tasks
    warm, bwd = min(m, pp - s), 0
    for fwd in range(warm):
        forward(fwd)
        wait(sent_f(fwd - 1))
    fwd = warm
    while True:
        wait(sent_f(fwd - 1) + recv_b(bwd))
        backward(bwd)
        bwd += 1
        if fwd == m:
            break
        wait(sent_b(bwd - 1) + recv_f(fwd))
        forward(fwd)
        fwd += 1
    while bwd < m:
        backward(bwd)
        wait(sent_b(bwd - 1))
        bwd += 1
    wait(sent_b(m - 1))
    return tasks
