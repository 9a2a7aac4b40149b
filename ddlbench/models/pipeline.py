"""Split a model of the zoo into an ordered list of pipeline *pieces*.

Applied in order, the pieces compute the model's logits: `head(...(piece1(piece0(x))))`, the
same operations as the model's own forward (tests/test_pipeline_split.py checks equality).
A pipeline stage is a contiguous run of pieces (`partition`). Each model family cuts its own
pieces (`Family.pieces`, ddlbench/models/families/): for a language model Embed | one piece per
block (with the rotary embedding and causal mask the model computes once) | Head (norm + lm_head).

GPT-2 (and Llama 3.2 1B/3B) tie lm_head.weight to the token embedding. Pieces keep the tie (the same Parameter object) when
they live in one process; the pipeline adapter, which keeps only its own stages, sums the
tied weight's gradient between the two ranks holding a copy (`tied_parameters`).
"""
from __future__ import annotations

import torch
from torch import nn


def pieces(model: nn.Module) -> list[nn.Module]:
    """The ordered pieces of a zoo model (a CausalLM or Classifier), as its family cuts them."""
    return model.family.pieces(model.net)


def loss_function(model: nn.Module):
    """loss(logits, labels, eval_weight=None) of the model, for the last pipeline stage."""
    from ddlbench.models.language import CausalLM, lm_loss
    from ddlbench.models.vision import classification_loss
    return lm_loss if isinstance(model, CausalLM) else classification_loss


def piece_count(model_cfg) -> int:
    """How many pieces the model splits into (built on the meta device: no memory, any size; once per
    config in a process: `bench project published=` checks 405B's layouts dozens of times)."""
    key = model_cfg.model_dump_json() if hasattr(model_cfg, "model_dump_json") else None
    if key is None:
        return _count(model_cfg)
    if key not in _COUNTS:
        _COUNTS[key] = _count(model_cfg)
    return _COUNTS[key]


_COUNTS: dict[str, int] = {}


def _count(model_cfg) -> int:
    from ddlbench import models
    with torch.device("meta"):
        return len(pieces(models.build(model_cfg).build()))


def stage_layout(model_cfg, schedule: str, pp: int, v: int) -> tuple[int, list[dict]]:
    """(pieces, [{stage, pp_rank, pieces: [first, last], params}]) of the model built on the meta device."""
    from ddlbench import models
    from ddlbench.models.spec import count_params
    with torch.device("meta"):
        piece_list = pieces(models.build(model_cfg).build())   # meta: the layout only
    owners = stage_owners(schedule, pp, v)
    return len(piece_list), [{"stage": s, "pp_rank": owners[s], "pieces": [r.start, r.stop - 1],
                              "params": count_params(nn.ModuleList(piece_list[i] for i in r))}
                             for s, r in enumerate(partition(len(piece_list), pp * v))]


def partition(n_pieces: int, n_stages: int) -> list[range]:
    """Contiguous piece ranges per stage. With at least as many body pieces (all but the first
    and last) as stages, the body is split evenly (earlier stages take the remainder) and the
    first/last piece (embedding, head) join the first/last stage, as Megatron and torchtitan
    place them; otherwise every piece is split evenly."""
    if n_stages < 1 or n_pieces < n_stages:
        raise ValueError(f"cannot split {n_pieces} pieces into {n_stages} stages")
    body = n_pieces - 2
    if body >= n_stages:
        sizes = [body // n_stages + (1 if i < body % n_stages else 0) for i in range(n_stages)]
        sizes[0] += 1
        sizes[-1] += 1
    else:
        sizes = [n_pieces // n_stages + (1 if i < n_pieces % n_stages else 0) for i in range(n_stages)]
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


class Stage(nn.Sequential):
    """A pipeline stage: its pieces applied in order."""


def tied_parameters(piece_list: list[nn.Module]) -> list[tuple[nn.Parameter, list[int]]]:
    """Parameters that appear in more than one piece, with the pieces that use them."""
    seen: dict[int, tuple[nn.Parameter, list[int]]] = {}
    for i, piece in enumerate(piece_list):
        for p in piece.parameters():
            entry = seen.setdefault(id(p), (p, []))
            if i not in entry[1]:
                entry[1].append(i)
    return [(p, idx) for p, idx in seen.values() if len(idx) > 1]


def untie(tied: list[tuple[nn.Parameter, list[int]]], stage_of: dict[int, int],
          local: dict[int, nn.Module]) -> tuple[list[tuple[list[nn.Parameter], list[int]]], set[int]]:
    """Give every stage its own copy of each tied parameter (zero-bubble schedules compute weight
    gradients per stage and do not accumulate into a Parameter shared by two local stages): the
    first stage that uses it keeps the parameter itself, every other stage in `local` (stage id ->
    this rank's module) gets a clone. `stage_of`: piece index -> stage. Returns, per tied
    parameter, (this rank's copies, the stages holding one), and the ids of the clones made."""
    out, made = [], set()
    for param, piece_ids in tied:
        stages = sorted({stage_of[i] for i in piece_ids})
        copies: list[nn.Parameter] = []
        for s in stages:
            if s not in local:
                continue
            copy = param if not copies and s == stages[0] else None
            for sub in local[s].modules():
                for name, p in list(sub._parameters.items()):
                    if p is param:
                        if copy is None:
                            copy = nn.Parameter(param.detach().clone())
                            made.add(id(copy))
                        sub._parameters[name] = copy
            if copy is not None and all(copy is not c for c in copies):
                copies.append(copy)
        out.append((copies, stages))
    return out, made


def stage_owners(schedule: str, pp: int, v: int) -> list[int]:
    """Pipeline rank of every stage: loop placement, or V for zbv."""
    if schedule == "zbv_zero_bubble":
        return [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]
    return [s % pp for s in range(pp * v)]
