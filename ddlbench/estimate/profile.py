"""A model's profile for the memory estimator, measured on the meta device (no memory, no
compute, so XL presets cost nothing): parameters, the largest block, and the bytes autograd saves
for backward per sample — counted by torch.autograd.graph.saved_tensors_hooks, with and without
activation checkpointing, over two batch sizes so that the per-sample slope excludes what does
not grow with the batch — and the same per pipeline piece (ddlbench/models/pipeline.py: embedding, each
block, head with the loss), with the piece's forward FLOPs (torch.utils.flop_counter), the bytes its
other ops move (models.flops.MemoryTraffic) and the parameters the tensor-parallel plan splits: what
lets tensor and pipeline parallelism keep the embedding and head whole instead of dividing evenly.

The model is profiled as it runs on the device (`device_type`: on CUDA GPT-2's one-kernel GELU, the
padded vocabulary, SDPA). SDPA's flash and memory-efficient kernels save no (T x T) attention
scores or probabilities, where eager attention (what runs on meta) saves several per layer; those
are left out when the run's attention is not eager (`attention_scores`). Found on an H200: with
them the estimate of Llama 1B at micro-batch 4 was 2.0x the measured peak."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.adapters.cost import ModelProfile, Piece
from ddlbench.models.flops import MemoryTraffic, ScoreFlops
from ddlbench.record import rundir


def attention_scores(shape, seq_len: int | None) -> bool:
    """A (batch, heads, T, T) storage: eager attention's scores or probabilities, which SDPA's
    fused kernels never save. Four dimensions: hidden states (batch, T, hidden) are 3-D and can
    have hidden == T (Llama 3.2 1B: 2048 and 2048)."""
    return seq_len is not None and len(shape) == 4 and shape[-1] == shape[-2] == seq_len


def _saver(params: set, saved: dict, seen: set = frozenset(), fused_attention_len: int | None = None,
           scores: list | None = None, seq_len: int | None = None, alive: list | None = None):
    """A saved_tensors_hooks pack function recording {storage id: bytes} of what autograd saves,
    parameters (not activations), storages in `seen` and, with `fused_attention_len` = T, the
    (T x T) attention tensors a fused kernel does not save, left out. `scores` (with `seq_len`)
    collects the bytes of each (T x T) attention tensor eager attention saves. Every storage counted
    is kept in `alive` while the ids are compared: a storage freed meanwhile would give its id to a
    new one, which then was not counted (DeepSeek-V3's blocks measured 1.3-1.37 MB a sample apart
    instead of 1,357,312 bytes each)."""
    alive = [] if alive is None else alive

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        alive.append(base)
        if (id(t) not in params and id(base) not in params and id(base) not in seen
                and not attention_scores(base.shape, fused_attention_len)):
            saved[id(base)] = base.numel() * base.element_size()
            if scores is not None and attention_scores(base.shape, seq_len):
                scores.append(base.numel() * base.element_size())
        return t
    return pack


def _meta_model(spec):
    """The model on meta: with eager attention where the run's is SDPA (its mask is decided from
    tensor values, impossible on meta), the fused kernels' savings then applied by the saver."""
    return (spec.count_factory or spec.factory)()


def _fused_len(spec) -> int | None:
    return spec.tokens_per_sample if spec.count_factory is not None else None


def _saved_bytes(spec, batch_size: int, checkpointed: bool | str, dtype=torch.float32,
                 scores: list | None = None) -> tuple[int, int]:
    """(bytes saved for backward by one forward, bytes of one block's output) on meta, with the
    model's floating-point parameters in `dtype`, under an activation checkpointing policy (true:
    full; selective_op's saved outputs are counted too: they pass the saved-tensor hooks)."""
    from ddlbench.models import checkpointing
    from ddlbench.models.spec import example_batch

    with torch.device("meta"):
        model = _meta_model(spec).to(dtype)
    checkpointing.apply(model, checkpointing.normalize(checkpointed))
    params = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}
    boundary = []
    blocks = model.blocks()
    hook = blocks[0].register_forward_hook(
        lambda m, i, o: boundary.append((o[0] if isinstance(o, tuple) else o).numel() * 4)) if blocks else None
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in example_batch(spec, batch_size, "meta").items()}
    with torch.autograd.graph.saved_tensors_hooks(_saver(params, saved, fused_attention_len=_fused_len(spec),
                                                         scores=scores, seq_len=spec.tokens_per_sample), lambda t: t):
        model(**batch)
    if hook is not None:
        hook.remove()
    return sum(saved.values()), (boundary[0] if boundary else 0)


def _per_piece(spec, batch_size: int, dtype) -> tuple[list[tuple], int]:
    """[(forward FLOPs, bytes saved for backward, of the FLOPs the (T x T) attention matmuls', bytes the other
    ops move eagerly, fused)] of each pipeline piece for one batch on meta, the pieces applied in order as the
    pipeline stages apply them (the last one with the loss), and the bytes of the last piece's output."""
    from ddlbench.models.pipeline import loss_function, pieces
    from ddlbench.models.spec import example_batch

    with torch.device("meta"):
        model = _meta_model(spec).to(dtype)
    params = {id(p) for p in model.parameters()}
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in example_batch(spec, batch_size, "meta").items()}
    x, loss, plist = batch["input_ids" if "input_ids" in batch else "images"], loss_function(model), pieces(model)
    out, seen, alive = [], set(), []       # a tensor two pieces save (one's output, the next one's input) counts once
    for i, piece in enumerate(plist):
        saved: dict[int, int] = {}
        counter, scores, traffic = FlopCounterMode(display=False), ScoreFlops(spec.tokens_per_sample), MemoryTraffic(_fused_len(spec))
        with torch.autograd.graph.saved_tensors_hooks(_saver(params, saved, seen, _fused_len(spec), alive=alive),
                                                      lambda t: t), counter, scores, traffic:
            x = piece(x)
            if i == len(plist) - 1:
                loss(x, batch["labels"])
        seen.update(saved)
        out.append((float(counter.get_total_flops()), sum(saved.values()), scores.flops, traffic.eager, traffic.fused))
    return out, x.numel() * x.element_size()


def pieces_profile(spec, dtype=torch.float32) -> tuple[tuple[Piece, ...], int]:
    """Piece of every pipeline piece: parameters (a tied weight in each piece that uses it), the
    tensor-parallel plan's share of them, forward FLOPs, saved and moved bytes per sample (slopes
    between batch 2 and 4); and the model's output bytes per sample."""
    from ddlbench.models.pipeline import pieces, tied_parameters
    from ddlbench.models.spec import count_params
    from ddlbench.models.tensor_parallel import split_param_count

    with torch.device("meta"):
        plist = pieces(_meta_model(spec))
    tied = [0] * len(plist)
    for p, idx in tied_parameters(plist):
        for i in idx:
            tied[i] += p.numel()
    (two, out2), (four, out4) = _per_piece(spec, 2, dtype), _per_piece(spec, 4, dtype)
    return tuple(Piece(params=count_params(piece), split_params=split_param_count(piece), tied_params=tied[i],
                       flops=(four[i][0] - two[i][0]) / 2, activation_bytes=(four[i][1] - two[i][1]) // 2,
                       attention_flops=(four[i][2] - two[i][2]) / 2, experts_params=_experts_in(piece, spec.family),
                       memory_bytes=(four[i][3] - two[i][3]) / 2, fused_bytes=(four[i][4] - two[i][4]) / 2)
                 for i, piece in enumerate(plist)), (out4 - out2) // 2


def _experts_in(piece, family) -> int:
    """Parameters of the experts of a block piece's MoE layer (0: dense, or not a block)."""
    plan = family.experts if family is not None else None
    moe = plan.moe_block(piece.layer) if plan is not None and hasattr(piece, "layer") else None
    return 0 if moe is None else sum(p.numel() for p in getattr(moe, plan.experts_attr).parameters())


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


CACHE_ENV = rundir.PROFILE_CACHE_ENV    # a directory: a sweep sets it for its cells (ddlbench/sweep/task.py)
# what the profile is computed by: a change to any of them is a new key
CODE = ("estimate/profile.py", "adapters/cost.py", "models/*.py")


def cache_key(model_cfg, precision: str, device_type: str) -> str:
    """What a profile depends on, hashed: the model's config, the precision, the device type, the
    torch and transformers versions and the code that computes it."""
    import hashlib
    import json
    from importlib.metadata import version
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    code = hashlib.sha1()
    for pattern in CODE:
        for f in sorted(root.glob(pattern)):
            code.update(f.read_bytes())
    cfg = model_cfg.model_dump() if hasattr(model_cfg, "model_dump") else dict(model_cfg)
    blob = json.dumps({"model": cfg, "precision": precision, "device": device_type, "torch": torch.__version__,
                       "transformers": version("transformers"), "code": code.hexdigest()}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:20]


_memo: dict = {}      # key -> ModelProfile: a process profiles a model once


def cached_profile(model_cfg, precision: str = "fp32", device_type: str = "cpu",
                   cache_dir=None) -> tuple[ModelProfile, str]:
    """(profile, where it came from). Once per key in a process (a sweep validates every cell, then
    forks them: they inherit it); with a cache directory (`cache_dir`, else $DDLBENCH_PROFILE_CACHE)
    also on disk, read back by every later cell of the sweep that is not forked from this process
    (Slurm array tasks): the model is not rebuilt (on CUDA not respawned) per cell. A damaged cache
    file is computed again."""
    import os
    from pathlib import Path

    from ddlbench.record.readers import DamagedFile, read_json
    from ddlbench.record.results import atomic_write_json
    cache_dir = cache_dir or os.environ.get(CACHE_ENV)
    key = cache_key(model_cfg, precision, device_type)
    path = Path(cache_dir) / f"profile-{key}.json" if cache_dir else None

    unusable: list[str] = []     # why the cache could not be used: said, never a failed run (it only saves time)

    def keep(prof: ModelProfile) -> None:
        _memo[key] = prof
        try:
            if path is not None and not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path, {"key": key, "precision": precision, "device": device_type,
                                         "profile": prof.to_dict()})
        except OSError as exc:
            unusable.append(f"not cached: {path}: {exc.strerror or exc}")
    if key in _memo:      # this process (or the sweep it was forked from) profiled it already
        keep(_memo[key])
        return _memo[key], _said("computed earlier in this process (a sweep validates its cells before it forks them)",
                                 unusable)
    if path is not None and path.is_file():
        try:
            stored = read_json(path, "memory-profile cache")
            if stored.get("key") != key:    # a file under this key's name made for another model or setting
                raise KeyError(f"it holds the profile of key {stored.get('key')!r}, not {key!r}")
            prof = ModelProfile.from_dict(stored["profile"])
            _memo[key] = prof
            return prof, f"cached {path}"
        except (DamagedFile, KeyError, TypeError, AttributeError, OSError) as exc:
            unusable.append(f"{path} not used ({exc}): measured again")
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
    prof = profile(model_cfg, precision, device_type)
    keep(prof)
    return prof, _said(f"measured, cached in {path}" if path is not None and not unusable else "measured", unusable)


def _said(where: str, unusable: list[str]) -> str:
    """Where a profile came from, with what kept the cache from being used (a warning on stderr too)."""
    import sys
    for why in unusable:
        print(f"bench: warning: memory-profile cache: {why}", file=sys.stderr)
    return where + "".join(f"; cache {why}" for why in unusable)


# whether a CUDA profile is measured in a spawned process (below); a command that never hands CUDA to a
# forked child may measure it in its own (`profiles_here`): no process and no torch import per model
SPAWN_FOR_CUDA = [True]


def profiles_here() -> None:
    """This process forks no child that needs CUDA (`bench project published=`): CUDA profiles are
    measured in it, not in a spawned process each."""
    SPAWN_FOR_CUDA[0] = False


def profile(model_cfg, precision: str = "fp32", device_type: str = "cpu") -> ModelProfile:
    """The profile (_profile) for a run on `device_type`. For CUDA it is measured in a spawned
    process of its own: building a transformers model imports torchao where it is installed, and
    torchao's import asks triton about the GPU (torch.cuda.current_device: CUDA initialised), which
    would leave this process (the sweep, advise, the launcher: they fork) unable to give CUDA to
    its children (caught by tests/test_gpu_fork.py's stand-in GPU)."""
    if device_type != "cuda" or not SPAWN_FOR_CUDA[0]:
        return _profile(model_cfg, precision, device_type)
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)     # a process and a pipe: no pool, whose semaphores a stop would leak
    proc = ctx.Process(target=_profile_into, args=(send, model_cfg, precision, device_type), daemon=True)
    proc.start()
    send.close()
    try:
        ok, answer = receive.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the memory profile's process ended without an answer (exit code {proc.exitcode})") from None
    except BaseException:      # a stop (SIGINT, SIGTERM): the process goes with the command
        proc.kill()
        proc.join()
        raise
    finally:
        receive.close()
    proc.join()
    if not ok:
        raise answer
    return answer


def _profile_into(send, model_cfg, precision: str, device_type: str) -> None:
    """_profile in a spawned process, with the parent's quiet start: (True, profile) or (False, the exception)."""
    from ddlbench.lifecycle import quiet
    quiet.install()
    try:
        answer = (True, _profile(model_cfg, precision, device_type))
    except Exception as exc:   # noqa: BLE001 - raised again in the parent
        answer = (False, exc)
    try:
        send.send(answer)
        send.close()
    except BrokenPipeError:    # the command stopped meanwhile: nobody to answer
        pass


def _profile(model_cfg, precision: str = "fp32", device_type: str = "cpu") -> ModelProfile:
    """At bf16/fp16 the activations are counted with the model in that dtype: what DeepSpeed's
    2-byte engine saves; autocast keeps a few in fp32 (norms, softmax, the loss), so for autocast
    frameworks this is a lower bound. `device_type`: the model as built for that device. The
    parameters are counted on the whole model; what one forward saves is measured on the whole
    model too, or, where the family's blocks are all alike (after its leading ones: DeepSeek-V3's dense
    first layers), on those and SHALLOW blocks, scaled to the depth (exact: tests/test_profile_scaling.py;
    Llama 3.1 405B's 126 blocks in seconds)."""
    from ddlbench.models.registry import build
    from ddlbench.models.spec import count_params

    spec = build(model_cfg, device_type)
    with torch.device("meta"):
        model = _meta_model(spec)
    blocks = model.blocks()
    dtype = DTYPES[precision]
    depth = getattr(model_cfg, "n_layer", None)
    lead = spec.family.leading_blocks(model_cfg) if spec.family is not None else 0
    if spec.family is not None and spec.family.uniform_blocks(model_cfg) and isinstance(depth, int) \
            and depth > lead + SHALLOW and len(blocks) == depth:
        forward = _scaled(_forward_profile(build(_at_depth(model_cfg, lead + SHALLOW), device_type), dtype, True),
                          _forward_profile(build(_at_depth(model_cfg, lead + SHALLOW - 1), device_type), dtype, True),
                          depth, lead)
    else:
        forward = _forward_profile(spec, dtype, bool(blocks))
    moe = {}
    if spec.top_k:
        from ddlbench.models.moe import experts_of
        experts = experts_of(model)
        moe = {"experts_params": sum(p.numel() for e in experts for p in e.parameters()), "moe_layers": len(experts),
               "routed_bytes_per_sample": spec.tokens_per_sample * spec.top_k * model_cfg.n_embd
               * torch.empty((), dtype=dtype).element_size()}
    return ModelProfile(
        params=count_params(model),
        largest_block_params=max((count_params(b) for b in blocks), default=count_params(model)),
        blocks=max(len(blocks), 1),
        largest_weight_params=max((p.numel() for p in model.parameters()), default=0),
        param_numels=tuple(sorted(p.numel() for p in model.parameters())),
        hidden_size=int(getattr(model_cfg, "n_embd", 0) or 0), attention_heads=int(getattr(model_cfg, "n_head", 0) or 0),
        kv_heads=int(getattr(model_cfg, "n_kv_head", 0) or getattr(model_cfg, "n_head", 0) or 0),
        causal_skip=causal_skip(spec), **_tp_layers(spec), **moe, **forward)


SHALLOW = 3     # blocks a uniform model's forward is measured at (and one fewer): the first, a middle one, the last


def _at_depth(model_cfg, blocks: int):
    """The model's config with `blocks` blocks."""
    if hasattr(model_cfg, "model_copy"):
        return model_cfg.model_copy(update={"n_layer": blocks})
    return {**dict(model_cfg), "n_layer": blocks}


def _forward_profile(spec, dtype, has_blocks: bool) -> dict:
    """What one forward saves for backward (every checkpointing policy, in `dtype` and under
    autocast) and the pipeline pieces' FLOPs and bytes: ModelProfile's forward fields."""
    full, ckpt, out2, sel, scores = _activation_slopes(spec, dtype, has_blocks)
    autocast = _activation_slopes(spec, torch.float32, has_blocks) if dtype != torch.float32 else (0,) * 5
    pieces, output = pieces_profile(spec, dtype)
    return {"activation_bytes_per_sample": full, "checkpointed_bytes_per_sample": ckpt,
            "boundary_bytes_per_sample": out2 // 2, "pieces": pieces, "output_bytes_per_sample": output,
            "autocast_activation_bytes_per_sample": autocast[0], "autocast_checkpointed_bytes_per_sample": autocast[1],
            "selective_op_bytes_per_sample": sel, "autocast_selective_op_bytes_per_sample": autocast[3],
            "attention_scores_bytes_per_sample": scores}


SAME_AT_ANY_DEPTH = ("boundary_bytes_per_sample", "output_bytes_per_sample", "attention_scores_bytes_per_sample")


def _scaled(at: dict, fewer: dict, depth: int, lead: int = 0) -> dict:
    """The forward fields of a model of `depth` blocks, uniform after its first `lead`, from its profiles at
    lead + SHALLOW and lead + SHALLOW - 1 blocks: each per-sample sum grows by one block's share per block;
    the pieces are the leading blocks, then the first uniform block, the middle one repeated, the last,
    between the embedding and the head."""
    out = {k: v if k in SAME_AT_ANY_DEPTH or k == "pieces" else v + (depth - lead - SHALLOW) * (v - fewer[k])
           for k, v in at.items()}
    body = at["pieces"][1:-1]
    first, *middle, last = body[lead:]
    out["pieces"] = (at["pieces"][0], *body[:lead], first, *([middle[0]] * (depth - lead - 2)), last, at["pieces"][-1])
    return out


def causal_skip(spec) -> float:
    """The share of the (T x T) attention matmuls the run's kernel skips: a causal language model
    under a fused kernel (SDPA with is_causal, flash: CPU and CUDA alike compute only the key blocks
    at or before each query block) half; eager attention computes them all and masks: none."""
    impl = (spec.config or {}).get("attn_implementation", "eager")
    return 0.5 if spec.kind == "language" and impl not in (None, "eager") else 0.0


def _tp_layers(spec) -> dict:
    """The family's tensor-parallel block plan, counted: row-wise and column-wise layers."""
    plan = spec.family.tensor_parallel if spec.family is not None else None
    if plan is None:
        return {}
    cols = sum(1 for col in plan.split_layers.values() if col)
    return {"tp_row_layers": len(plan.split_layers) - cols, "tp_column_layers": cols}


def _activation_slopes(spec, dtype, has_blocks: bool) -> tuple[int, int, int, int]:
    """Bytes saved per sample without checkpointing, with every block checkpointed and under
    selective_op (slopes between batch 2 and 4), one block's output at batch 2, and the largest
    (T x T) attention tensor eager attention saves, per sample (0 with a fused kernel)."""
    full2, out2 = _saved_bytes(spec, 2, False, dtype)
    scores: list[int] = []
    full4, _ = _saved_bytes(spec, 4, False, dtype, scores)
    ck2, _ = _saved_bytes(spec, 2, True, dtype) if has_blocks else (full2, 0)
    ck4, _ = _saved_bytes(spec, 4, True, dtype) if has_blocks else (full4, 0)
    op2, _ = _saved_bytes(spec, 2, "selective_op", dtype) if has_blocks else (full2, 0)
    op4, _ = _saved_bytes(spec, 4, "selective_op", dtype) if has_blocks else (full4, 0)
    return (full4 - full2) // 2, (ck4 - ck2) // 2, out2, (op4 - op2) // 2, max(scores, default=0) // 4
