"""One training step's collectives at a world size no run had: the framework's own code, set up for
rank 0 of W ranks in one process over torch's fake process group (collectives return at once, no
peer exists), counted where they are issued (ddlbench/comm/probe.py's dispatch mode): kind, group
size, bytes, calls. torchtitan dry-runs its layouts the same way (comm.mode fake backend).

FSDP2-based strategies build the model on the meta device and give storage to their shards only
(any size traces in 1/W of its memory; the values are garbage, the collectives' sizes are not);
the others build it for real on the host (CPU tensors, the run's precision): a few GB at most.
Frameworks whose collectives do not go through c10d (Horovod), or whose step needs what a fake
peer does not send back, cannot run so (`traceable` says why). Processes of their own do the work
(forked from a fork server), so the caller's process never holds a fake group.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

# what the fork server imports once, its quiet start first (ddlbench/project/trace_server.py)
PRELOAD = ["ddlbench.project.trace_server"]

def traceable(variant) -> Optional[str]:
    """Why this framework variant's step cannot be traced over a fake group, or None (its Variant says)."""
    return variant.abilities().fake_group


# Where every collective follows the parameters, the positions a traced step computes on change no
# payload, only its work (~ tokens x parameters): re-planning the H200 llama_1b record at 8 and 1,024
# ranks traced 64 positions of bf16 on a 2-core VM's CPU for 60-120 s
PARAMETER_BOUND_TOKENS = 8


def follows_parameters(plan) -> bool:
    """Whether every collective of the plan's step is sized by the parameters, never by the batch:
    data parallelism alone (no tensor, pipeline or context split, no experts over ranks)."""
    d = plan.dims
    return d.tp == d.pp == d.cp == 1 and not plan.variant.abilities().step.experts


def record_variant(rec: dict):
    """The Variant of a record's configuration (its adapter and options, as validation builds it)."""
    from ddlbench.planning.config import load_variant_class
    fw = (rec.get("config") or {}).get("framework") or {}
    cls = load_variant_class(fw.get("adapter", ""))
    return cls(cls.Options.model_validate(fw.get("options") or {}))


def trace(overrides: list[str], world: int, timeout_s: float = 300) -> dict:
    """{'world', 'per_step_bytes': {kind: bytes}, 'per_step_calls', 'by_group': {kind: {'<ranks>@1': bytes}},
    'framework', 'dims'} for one training step of the config `overrides` at `world` ranks (rank 0),
    in a process of its own. Raises ValueError where it cannot."""
    out = trace_all([(overrides, world)], timeout_s)[0]
    if "error" in out:
        raise ValueError(out["error"])
    return out


def trace_record(rec: dict, world: int, max_tokens: int = 64, timeout_s: float = 600) -> dict:
    """A 1-rank record's configuration re-planned at `world` ranks (weak scaling: each rank keeps the
    record's micro-batch and accumulation), its step traced. Raises ValueError where it cannot:
    the framework, or a model too large to build on this host (unless its Variant builds_on_meta the
    whole model is built once, in fp32, before the framework shards it)."""
    import copy
    import os
    cfg, par = copy.deepcopy(rec.get("config") or {}), rec.get("parallel") or {}
    fw = cfg.get("framework") or {}
    variant = record_variant(rec)
    reason = traceable(variant)
    if reason:
        raise ValueError(f"framework {fw.get('name')} cannot be traced over a fake process group: {reason}")
    params = (rec.get("model") or {}).get("params") or 0
    can = variant.abilities()
    built = 0 if can.builds_on_meta else 4 * params     # the whole model, before a framework shards it
    need = built + (12 * params / world if can.shards_model_state else 12 * params)
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2
    if need > limit:
        raise ValueError(f"{(rec.get('model') or {}).get('name')} needs ~{need / 2**30:.1f} GiB to trace here "
                         f"(the model built once, then the framework's state for one of {world} ranks); this host "
                         f"offers {limit / 2**30:.1f} GiB (half its memory)")
    local = int(par.get("micro_batch", 1)) * int(par.get("grad_accum", 1))
    cfg["run"] = {**cfg["run"], "global_batch": local * world, "micro_batch": int(par.get("micro_batch", 1)),
                  "precision": rec.get("precision") or cfg["run"].get("precision")}
    return trace_all([(cfg, world, max_tokens)], timeout_s)[0]


def trace_all(cases: list[tuple], timeout_s: float = 600, workers: int = 2,
              start_method: str = "forkserver") -> list[dict]:
    """`trace` of each (overrides, world), each in a fresh process (frameworks keep process groups in
    globals: DeepSpeed's outlive the fake group they were made on), `workers` at a time; a case that
    fails gives {'error': message}. The processes fork from a server that imported torch,
    transformers and the frameworks once (PRELOAD) and computes nothing: ~2x faster than a fresh
    interpreter a case (4 cases, 2 workers: 6-10 s against 17 s on a 2-core VM probing 295 GFLOP/s).
    start_method="fork" forks the caller itself (2.5 s there) and is only for a caller that has imported torch and never run a
    multi-threaded OpenMP region (the test suite's process: ddlbench/launch/forked.py)."""
    import multiprocessing

    from ddlbench.lifecycle import quiet
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    # a process forked from the server starts without the parent's quiet start: it filters the same chatter
    try:
        return _run_cases(ctx, [(o if isinstance(o, dict) else list(o), *rest) for o, *rest in cases],
                          max(1, workers), timeout_s, quiet.install)
    finally:
        if start_method == "forkserver":   # stopped and waited for here: it must not outlive the command
            from multiprocessing import forkserver
            getattr(forkserver._forkserver, "_stop", lambda: None)()


def _run_cases(ctx, cases: list[tuple], workers: int, timeout_s: float, initializer, target=None) -> list[dict]:
    """Each case in a process of its own, `workers` at a time, its answer through a pipe. A process
    killed by a signal before answering (a native abort: seen once, SIGABRT inside FSDP2's all-gather
    over the fake group, in the suite) runs its case once more in a fresh one, the answer then saying
    so (`first_attempt`); a second death, or an exit without an answer, is the case's {'error'}: never
    a wait for an answer that will not come (a pool lost such a task, and its caller waited out `timeout_s`). multiprocessing.TimeoutError after `timeout_s`, every process killed.
    `target(*case)` gives a case's answer (default: _trace_case)."""
    import multiprocessing
    import time
    from multiprocessing.connection import wait
    deadline = time.monotonic() + timeout_s
    results: list = [None] * len(cases)
    pending, running, died = list(enumerate(cases)), {}, {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                i, case = pending.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                fd, crash = tempfile.mkstemp(prefix="ddlbench-trace-", suffix=".crash")
                os.close(fd)
                proc = ctx.Process(target=_case_process, args=(send, case, initializer, target or _trace_case, crash),
                                   daemon=True)
                proc.start()
                send.close()
                running[i] = (proc, receive, crash)
            for i, (proc, receive, crash) in list(running.items()):
                if receive.poll():
                    try:
                        results[i] = receive.recv()
                        if i in died:      # said, never hidden
                            results[i] = {**results[i], "first_attempt": died[i]}
                    except EOFError:      # it ended without sending
                        proc.join()
                        why = (f"the trace process ended without an answer (exit code {proc.exitcode})"
                               + _where_it_died(crash))
                        if proc.exitcode is not None and proc.exitcode < 0 and i not in died:
                            died[i] = why + "; the case ran again"    # a signal: once more, in a fresh process
                            pending.insert(0, (i, cases[i]))
                        else:
                            results[i] = {"error": why + (f" (and before: {died[i]})" if i in died else "")}
                    proc.join()
                    receive.close()
                    _remove(crash)
                    del running[i]
            if running and time.monotonic() > deadline:
                raise multiprocessing.TimeoutError(f"trace cases still running after {timeout_s:g} s")
            if running:
                wait([r for _, r, _ in running.values()] + [p.sentinel for p, _, _ in running.values()], timeout=0.5)
    finally:
        for proc, receive, crash in running.values():
            proc.kill()
            proc.join()
            receive.close()
            _remove(crash)
    return results


def _case_process(send, case: tuple, initializer, target, crash: str) -> None:
    import faulthandler
    with open(crash, "w") as out:     # a native abort's Python stack, for the case's error
        faulthandler.enable(out, all_threads=True)
        initializer()
        send.send(target(*case))
        send.close()
        faulthandler.disable()


def _where_it_died(crash: str, frames: int = 4) -> str:
    """'; Fatal Python error: ...; in f (file.py:N) < g (file.py:M)' from the faulthandler dump a killed
    case left (its own thread's innermost frames first, multiprocessing's own left out), or ''."""
    import re
    try:
        with open(crash) as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    fatal = next((line for line in lines if line.startswith("Fatal Python error")), "")
    start = next((n for n, line in enumerate(lines) if line.startswith(("Current thread", "Thread 0x"))), None)
    stack = []
    for line in lines[start + 1:] if start is not None else []:
        m = re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)
        if not m:
            break
        if "/multiprocessing/" not in m[1]:
            stack.append(f"{m[3]} ({os.path.basename(m[1])}:{m[2]})")
    where = " < ".join(stack[:frames])
    return "".join(f"; {x}" for x in (fatal, f"in {where}" if where else "") if x)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def time_step(config: dict, world: int, steps: int = 3, device: str = "cpu", timeout_s: float = 900) -> dict:
    """The framework's own training step for rank 0 of `world` ranks over the fake process group,
    timed (`steps` after two warm-up steps, device-synchronised): what rank 0 computes at that layout
    with the framework's hooks, casts and its optimizer's share, and no communication (a fake
    collective returns at once). {'step_s': median, 'steps_s': [...], ...} as `trace`, or {'error'}.
    On CUDA the process is spawned: a process forked from the fork server could not use the GPU (an
    H200, 2026-11-30: "Cannot re-initialize CUDA in forked subprocess"; an import there touches it)."""
    return trace_all([(config, world, None, steps, device)], timeout_s, start_method=start_method(device))[0]


def start_method(device: str) -> str:
    """How time_step's process starts: spawned for a GPU (a fresh interpreter that has touched no
    driver), else forked from the fork server (~2x faster)."""
    return "spawn" if device.startswith("cuda") else "forkserver"


def _trace_case(overrides, world: int, max_tokens: int | None = None, time_steps: int = 0,
                device: str = "cpu") -> dict:
    try:
        return _trace(overrides, world, max_tokens, time_steps, device)
    except Exception as exc:   # noqa: BLE001 - one case's failure is that case's answer
        return {"error": f"{type(exc).__name__}: {exc}"}


def _fake_allreduce_hook(state, bucket):
    """DDP's own all-reduce of a bucket, as a Python hook: under the fake group the built-in hook's
    future holds no tensor (DDP's reducer then fails); this one hands the bucket back. The same
    collective, the same bytes, in the same order."""
    import torch.distributed as dist
    buf = bucket.buffer()
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda _: buf)


def _on_meta(build):
    import torch
    with torch.device("meta"):
        return build()


def _trace(overrides, world: int, max_tokens: int | None = None, time_steps: int = 0, device: str = "cpu") -> dict:
    """`overrides`: a list of `bench run` overrides, or a resolved config (a record's `config`,
    launcher.nproc and run.device set here). `max_tokens`: language batches cut to their first
    max_tokens positions, and to one sample per micro-batch (and, with no step timed, to
    PARAMETER_BOUND_TOKENS positions) where every payload follows the parameters (follows_parameters). `time_steps`: that many more steps timed on `device`
    (parameters a meta build left empty are filled first, and on a CPU denormals flushed: what a
    fake gather leaves in its output is never read as data)."""
    import contextlib
    import os
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddlbench.adapters.base import RankContext
    from ddlbench.adapters.optim import build_optimizer_factory
    from ddlbench.comm.probe import CollectiveCounter
    from ddlbench.models.data import SyntheticData
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.project.shapes_only import ShapesOnly

    if isinstance(overrides, dict):
        from ddlbench.planning.config import validate
        raw = {**overrides, "launcher": {**overrides["launcher"], "nproc": world, "nodes": 1},
               "run": {**overrides["run"], "device": "cpu"}}
        raw["run"]["device"] = device
        plan = validate(raw)
    else:
        plan = plan_from_overrides([*overrides, f"launcher.nproc={world}", f"run.device={device}"])
    cfg = plan.cfg
    reason = traceable(plan.variant)
    if reason:
        raise ValueError(f"framework {cfg.framework.name} cannot be traced over a fake process group: {reason}")
    # DeepSpeed asks the launcher's environment even when a group exists
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        torch.manual_seed(cfg.run.seed)
        precision = "fp32" if cfg.run.precision == "auto" else cfg.run.precision
        where = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        if where.type == "cuda":
            torch.cuda.set_device(where)
        ctx = RankContext(rank=0, local_rank=0, world_size=world, device=where, backend="fake",
                          precision=precision, hosts=("host",) * world)
        spec = model_for(cfg, where)
        strategy = plan.variant.strategy_class()(plan.variant, ctx, plan.dims)
        meta = plan.variant.abilities().builds_on_meta and plan.dims.dp_shard > 1
        build = (lambda: _on_meta(spec.build)) if meta else spec.build
        strategy.setup(build, build_optimizer_factory(cfg.optim, where.type))
        if meta:      # FSDP2's sharded parameters (and the buffers) get storage; their values do not matter here
            strategy.model.to_empty(device=where)
            if time_steps:     # ... but a timed step should not compute on garbage
                _fill(strategy.model)
        if time_steps and where.type == "cpu":
            torch.set_flush_denormal(True)
        from torch.nn.parallel import DistributedDataParallel
        if isinstance(strategy.model, DistributedDataParallel):
            strategy.model.register_comm_hook(None, _fake_allreduce_hook)
        data = SyntheticData(spec, cfg.run.seed, plan.dims.global_batch, 0, plan.dims.local_batch, 1, where)
        batch = data.batch(0)
        if max_tokens and "input_ids" in batch:
            if follows_parameters(plan):     # one sample per micro-batch: the same collectives, ~1/micro_batch of the work
                if not time_steps:           # ... and, untimed, PARAMETER_BOUND_TOKENS positions of it
                    max_tokens = min(max_tokens, PARAMETER_BOUND_TOKENS)
                batch = {k: v[: plan.dims.grad_accum] for k, v in batch.items()}
            batch = {k: v[:, :max_tokens] for k, v in batch.items()}
        # untimed on a meta build (values garbage already), the matrix products are left uncomputed
        # (shapes_only.py): the sizes are the same. A framework built for real may read its values
        # (DeepSpeed skips the step whose gradients overflow, and gathers nothing after it)
        with (ShapesOnly() if meta and not time_steps else contextlib.nullcontext()):
            strategy.train_step(batch)          # the first step builds what later steps reuse
            counter = CollectiveCounter([0] * world)
            with counter:
                strategy.train_step(batch)
        counts = counter.take()
        state = state_bytes(strategy)
        timed = []
        for _ in range(time_steps):
            _device_sync(where)
            t0 = time.perf_counter()
            strategy.train_step(batch)
            _device_sync(where)
            timed.append(time.perf_counter() - t0)
    finally:
        dist.destroy_process_group()
    return {"world": world, "framework": f"{cfg.framework.name}:{cfg.framework.variant}", "dims": plan.dims.as_dict(),
            "per_step_bytes": {k: v["bytes"] for k, v in counts.items()},
            "per_step_calls": {k: v["calls"] for k, v in counts.items()},
            "by_group": {k: v.get("group_bytes", {}) for k, v in counts.items()},
            "calls_by_group": {k: v.get("group_calls", {}) for k, v in counts.items()},
            "state_bytes": state,
            **({"step_s": statistics.median(timed), "steps_s": timed, "device": str(where)} if timed else {}),
            "method": "the framework's own step for rank 0 over torch's fake process group "
                      "(torch.testing._internal.distributed.fake_pg), counted by ddlbench/comm/probe.py"}


def model_for(cfg, where):
    """The run's model built for the device its step runs on: on CUDA its attention is SDPA (no T x T
    scores kept), as the pieces the step is set against were timed (an H200, 2026-11-30: built for the
    CPU, llama_8b's 5 blocks ran eager attention at 2 x 8192 tokens and asked for 16 GiB of fp32
    scores with 95 GiB allocated)."""
    from ddlbench import models
    return models.build(cfg.model, where.type)


def _device_sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fill(model) -> None:
    """Small normal values in every parameter's local storage (a meta build's shards hold garbage)."""
    import torch
    from torch.distributed.tensor import DTensor
    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if isinstance(p, DTensor) else p).normal_(0.0, 0.02)


def state_bytes(strategy) -> dict:
    """The model state rank 0 holds between steps, read from the framework's own objects after a
    step: {'params': bytes of its parameters' storage (a sharded parameter's local shard), 'optimizer':
    bytes of its optimizer's state tensors}; each storage counted once."""
    import torch
    from torch.distributed.tensor import DTensor
    seen: set = set()

    def nbytes(t) -> int:
        if isinstance(t, DTensor):
            t = t.to_local()
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return 0
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    model = getattr(strategy, "model", None)
    # DeepSpeed ZeRO-3 keeps each parameter's partition in `ds_tensor` beside what it holds gathered
    # (parameters under its persistence threshold stay whole)
    params = sum(nbytes(p) + nbytes(getattr(p, "ds_tensor", None)) for p in model.parameters()) if model is not None else 0
    opt = getattr(strategy, "optimizer", None)
    opt = getattr(opt, "optim", opt)      # FairScale OSS: the rank's own optimizer over its shard
    state = getattr(opt, "state", None) or {}
    optim = sum(nbytes(v) for st in state.values() if isinstance(st, dict) for v in st.values())
    return {"params": params, "optimizer": optim}
