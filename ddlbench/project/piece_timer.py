"""Compute per piece measured on the device at hand (`bench project ... calibrate=pieces`): the
model built at reduced depth (1 and 5 blocks: every block of a family has the same shapes), its
embedding and its head with the loss timed as their pipeline pieces (ddlbench/models/pipeline.py),
a block as what four more blocks add to the model's own step, forward and backward, at the run's
micro-batch and precision, as a step runs them. What the roofline's single efficiency stood in
for becomes one measured time per piece, which the schedule applies at every layout and world size
(ddlbench/estimate/scale.py: piece_times), per sample at the micro-batch it was timed at.

The optimizer's step is timed too (the run's optimizer over fp32 copies of the parameters at both
depths): its time per parameter is the slope, and a layout's step adds it times the parameters its
busiest rank steps (its shard where the framework shards optimizer state).

Stated assumptions: a tensor-parallel or sequence-split piece takes its share of the FLOPs of the
time its whole shape took (smaller local matmuls are usually slower: optimistic there); recompute
takes the forward's time; the optimizer's time is linear in the parameters it steps (a shard's
per-tensor launches cost what the whole tensor's did: optimistic at large shard counts on a GPU).
"""
from __future__ import annotations

import time

import torch

from ddlbench.estimate.profile import DTYPES


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


MORE = 4          # a block's time: (the model at 1 + MORE blocks - at 1 block) / MORE
FRAMEWORK_TIMEOUT_S = 300   # the framework's own step over a fake group (a process of its own), set-up included


def _build(model_cfg, n_layer: int, precision: str, device: torch.device):
    from ddlbench import models
    cfg = model_cfg.model_copy(update={"n_layer": n_layer})
    spec = models.build(cfg, device.type)
    torch.manual_seed(0)
    return spec, spec.build().to(device=device, dtype=DTYPES[precision])


def _fastest_pair(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The fastest forward and the fastest backward of the repeats: load from other processes on a
    shared machine (a busy core, an OpenMP team waiting for a descheduled thread) only adds time."""
    return min(f for f, _ in pairs), min(b for _, b in pairs)


def _pass(run, device: torch.device) -> tuple[float, float]:
    """(forward s, backward s) of one `run()` (returns what to call backward on)."""
    _sync(device)
    t0 = time.perf_counter()
    target = run()
    _sync(device)
    t1 = time.perf_counter()
    target.backward() if target.dim() == 0 else target.backward(torch.ones_like(target))
    _sync(device)
    return t1 - t0, time.perf_counter() - t1


def _forward_backward(run, device: torch.device, repeats: int) -> list[tuple[float, float]]:
    """`repeats` passes of `run()` after one warm-up (allocator, kernels' autotuning)."""
    _pass(run, device)
    return [_pass(run, device) for _ in range(repeats)]


def _optimizer_step_s(model, device: torch.device, optim_cfg, repeats: int) -> float:
    """The fastest seconds of the run's optimizer (ddlbench/adapters/optim.py: its implementation on this device)
    stepping fp32 copies of the model's parameters with gradients, as a sharded framework steps its
    fp32 shards, after one warm-up step (which makes the state)."""
    from ddlbench.adapters.optim import build_optimizer_factory
    params = [torch.zeros(p.shape, dtype=torch.float32, device=device, requires_grad=True) for p in model.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = build_optimizer_factory(optim_cfg, device.type)(params)
    out = []
    for r in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        optimizer.step()
        _sync(device)
        if r:
            out.append(time.perf_counter() - t0)
    return min(out)


def time_pieces(model_cfg, precision: str, device: torch.device, micro_batch: int, repeats: int = 5,
                optim_cfg=None) -> dict:
    """{'embedding', 'block', 'head': (forward s, backward s)}, the fastest of `repeats` after one
    warm-up (the two depths timed in turn), at `micro_batch`, the parameters in the precision's dtype (the compute copies a
    sharded framework trains with), on `device`. A block is the whole model's step at 1 + MORE
    blocks less the same at one, over MORE (what a block adds inside the model's own forward: the causal mask and
    rotary embedding the model builds once are not charged to every block, as a pipeline piece
    would); the embedding and the head (with the loss) are timed as their pieces at one block."""
    from ddlbench.models.language import takes_mask
    from ddlbench.models.pipeline import loss_function, pieces
    from ddlbench.models.spec import example_batch
    if not hasattr(model_cfg, "n_layer"):
        raise ValueError(f"{getattr(model_cfg, 'name', 'the model')} has no n_layer: calibrate=pieces times "
                         "decoder blocks")
    runs, stepped = {}, {}
    for depth in (1 + MORE, 1):      # the shallow model last: its pieces are timed too
        spec, model = _build(model_cfg, depth, precision, device)
        batch = {k: v.to(device) for k, v in example_batch(spec, micro_batch, device.type,
                                                                          mask=takes_mask(model)).items()}
        runs[depth] = lambda m=model, b=batch: m(**b)
        _pass(runs[depth], device)   # warm-up
        if optim_cfg is not None:
            stepped[depth] = (_optimizer_step_s(model, device, optim_cfg, repeats),
                              sum(p.numel() for p in model.parameters()))
    # the two depths in turn, repeat by repeat: a burst of load from elsewhere falls on both alike
    passes = {depth: [] for depth in runs}
    for _ in range(repeats):
        for depth, run in runs.items():
            passes[depth].append(_pass(run, device))
    whole = {depth: _fastest_pair(p) for depth, p in passes.items()}
    plist, loss = pieces(model), loss_function(model)
    ids, labels = batch["input_ids"], batch["labels"]
    hidden = plist[1](plist[0](ids)).detach()
    emb = _fastest_pair(_forward_backward(lambda: plist[0](ids), device, repeats))
    head = _fastest_pair(_forward_backward(lambda: loss(plist[-1](hidden.requires_grad_()), labels), device, repeats))
    block = tuple((more - one) / MORE for more, one in zip(whole[1 + MORE], whole[1]))
    if min(block) <= 0:
        raise ValueError(f"calibrate=pieces: {MORE} more blocks did not take longer on this {device.type} "
                         f"(forward/backward {whole[1]} s at 1 block, {whole[1 + MORE]} s at {1 + MORE}): the blocks "
                         "are within its timing noise; give a larger local_batch= or calibrate=TOKENS_PER_S@DEVICES")
    out = {"embedding": emb, "block": block, "head": head, "model_s": dict(whole)}
    if stepped:   # what one more parameter costs the optimizer's step: the slope over the MORE blocks
        (t_more, n_more), (t_one, n_one) = stepped[1 + MORE], stepped[1]
        slope = (t_more - t_one) / (n_more - n_one)
        # the slope, or where the two steps are within the timing noise (a busy machine) the mean per
        # parameter at 1 + MORE blocks (an upper bound: it carries the step's fixed cost), never 0
        out["optimizer_s_per_param"] = slope if slope > 0 else t_more / n_more
        out["optimizer_rule"] = ("slope over the blocks" if slope > 0 else
                                 f"mean per parameter at {1 + MORE} blocks: the slope was within the timing noise")
        out["optimizer_step_s"] = {1 + MORE: t_more, 1: t_one}
    return out


def framework_factor(plan, prof, timed: dict, optimizer: dict, device: str, steps: int = 5) -> dict:
    """The framework's own step at the plan's layout against the bare model's: the plan at 1 + MORE
    blocks set up for rank 0 of its world over the fake process group (ddlbench/project/collectives.py:
    time_step; its hooks, casts, accumulation and optimizer share, no communication), over the model's
    forward and backward at that depth x the micro-batches a step runs plus the optimizer's time for
    the parameters that rank steps. {'factor', 'framework_step_s', 'bare_step_s', ...}, or {'error'}
    where the framework cannot run so (the projection then prices the bare pieces, and says so)."""
    import copy

    from ddlbench.project.collectives import time_step, traceable
    cfg = plan.cfg
    reason = traceable(plan.variant)
    if reason:
        return {"error": f"{cfg.framework.name} cannot run over a fake process group: {reason}"}
    raw = copy.deepcopy(plan.raw)
    raw["model"]["n_layer"] = 1 + MORE
    options = raw["framework"].get("options") or {}
    if options.get("activation_checkpointing") not in (None, False, "none"):
        options["activation_checkpointing"] = "none"    # the pieces are timed without it; the schedule adds recompute
    import multiprocessing
    try:
        got = time_step(raw, plan.dims.world_size, steps, device, timeout_s=FRAMEWORK_TIMEOUT_S)
    except multiprocessing.TimeoutError:
        return {"error": f"the framework's step did not finish in {FRAMEWORK_TIMEOUT_S} s"}
    if "error" in got:
        return {"error": got["error"]}
    from ddlbench.estimate.memcheck import cost_of_plan
    cost = cost_of_plan(plan, prof, plan.dims.world_size)     # who shards the optimizer: the layout's, not the depth's
    shard = max(cost.shard_ranks, 1) if cost.shard_optimizer else 1
    bare = sum(timed["model_s"][1 + MORE]) * plan.dims.grad_accum + optimizer["optimizer_step_s"][1 + MORE] / shard
    return {"factor": got["step_s"] / bare, "framework_step_s": got["step_s"], "framework_steps_s": got["steps_s"],
            "bare_step_s": bare, "world": plan.dims.world_size, "blocks": 1 + MORE, "device": got["device"],
            "rule": f"factor = the framework's step for rank 0 of {plan.dims.world_size} over a fake process group "
                    f"(model at {1 + MORE} blocks) / (the bare model's forward + backward at that depth x "
                    f"{plan.dims.grad_accum} micro-batches + its optimizer over 1/{shard} of the parameters), both "
                    "without activation checkpointing (the schedule adds recompute); every piece and the optimizer "
                    "priced x factor"}


def per_sample(prof, timed: dict, micro_batch: int) -> list[tuple[float, float]]:
    """Seconds per sample of each of the profile's pieces, forward and backward, every block at
    the timed block's (what scale.piece_times multiplies by a layout's micro-batch and share)."""
    n = len(prof.pieces)
    return [tuple(t / micro_batch for t in timed["embedding" if i == 0 else "head" if i == n - 1 else "block"])
            for i in range(n)]
