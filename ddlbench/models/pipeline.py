"""Split a model of the zoo into an ordered list of pipeline *pieces*.

Applied in order, the pieces compute the model's logits: `head(...(piece1(piece0(x))))`, the
same operations as the model's own forward (tests/test_pipeline_split.py checks equality).
A pipeline stage is a contiguous run of pieces (`partition`). Pieces:
- GPT-2: Embed (wte + wpe + dropout) | one piece per transformer block | Head (ln_f + lm_head)
- Llama: Embed (embed_tokens) | one piece per decoder layer (with its rotary embedding and causal
  mask, computed per piece as LlamaModel computes them once) | Head (norm + lm_head)
- ViT: Embed (patchify, class token, position embedding, dropout) | encoder layers | Head
- ResNet: Stem (conv, bn, relu, maxpool) | one piece per residual block | Head (pool, fc)
- VGG: the feature extractor cut after each max-pool | Head (pool, classifier)

GPT-2 (and Llama 3.2 1B/3B) tie lm_head.weight to the token embedding. Pieces keep the tie (the same Parameter object) when
they live in one process; the pipeline adapter, which keeps only its own stages, sums the
tied weight's gradient between the two ranks holding a copy (`tied_parameters`).
"""
from __future__ import annotations

import torch
from torch import nn

from ddlbench.models.masks import causal_mask


class _Embed(nn.Module):
    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class _Block(nn.Module):
    """One GPT-2 block with the causal mask GPT2Model builds for it (no padding, no cache)."""

    def __init__(self, block: nn.Module, config):
        super().__init__()
        self.block, self.config = block, config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = causal_mask(self.config, hidden)
        return self.block(hidden, None, mask, position_ids=pos)


class _LMHead(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.ln_f, self.lm_head = net.transformer.ln_f, net.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


class _LlamaEmbed(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.embed_tokens = model.embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class _LlamaBlock(nn.Module):
    """One Llama decoder layer with the rotary embedding and causal mask LlamaModel builds for it
    (positions 0..T-1, no padding, no cache). The rotary module has no parameters (inv_freq buffer)."""

    def __init__(self, layer: nn.Module, config, rotary: nn.Module):
        super().__init__()
        self.layer, self.config, self.rotary = layer, config, rotary

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = causal_mask(self.config, hidden)
        return self.layer(hidden, attention_mask=mask, position_ids=pos,
                          position_embeddings=self.rotary(hidden, position_ids=pos))


class _LlamaHead(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.norm, self.lm_head = net.model.norm, net.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


class _VitEmbed(nn.Module):
    def __init__(self, vit: nn.Module):
        super().__init__()
        self.class_token, self.conv_proj = vit.class_token, vit.conv_proj  # the model's order
        self.pos_embedding, self.dropout = vit.encoder.pos_embedding, vit.encoder.dropout

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n, _, h, w = images.shape
        p = self.conv_proj.kernel_size[0]
        x = self.conv_proj(images).reshape(n, -1, (h // p) * (w // p)).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.dropout(x + self.pos_embedding)


class _VitHead(nn.Module):
    def __init__(self, vit: nn.Module):
        super().__init__()
        self.ln, self.heads = vit.encoder.ln, vit.heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.ln(x)[:, 0])


class _PoolHead(nn.Module):
    """avgpool -> flatten -> classifier (ResNet fc, VGG classifier)."""

    def __init__(self, pool: nn.Module, classifier: nn.Module):
        super().__init__()
        self.pool, self.classifier = pool, classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(x), 1))


def pieces(model: nn.Module) -> list[nn.Module]:
    """The ordered pieces of a zoo model (models.language.CausalLM / models.vision.Classifier)."""
    from ddlbench.models.vision import LinearClassifier
    net = model.net
    if isinstance(net, LinearClassifier):
        return [net]                 # one piece: nothing to pipeline
    if hasattr(net, "transformer"):  # GPT-2
        return [_Embed(net.transformer), *(_Block(b, net.config) for b in net.transformer.h), _LMHead(net)]
    if hasattr(net, "model") and hasattr(net.model, "layers"):   # Llama
        m = net.model
        return [_LlamaEmbed(m), *(_LlamaBlock(layer, net.config, m.rotary_emb) for layer in m.layers), _LlamaHead(net)]
    if hasattr(net, "encoder"):      # ViT
        return [_VitEmbed(net), *net.encoder.layers, _VitHead(net)]
    if hasattr(net, "layer1"):       # ResNet
        stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        blocks = [b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer]
        return [stem, *blocks, _PoolHead(net.avgpool, net.fc)]
    groups, current = [], []         # VGG: cut the features after each max-pool
    for layer in net.features:
        current.append(layer)
        if isinstance(layer, nn.MaxPool2d):
            groups.append(nn.Sequential(*current))
            current = []
    if current:
        groups.append(nn.Sequential(*current))
    return [*groups, _PoolHead(net.avgpool, net.classifier)]


def loss_function(model: nn.Module):
    """loss(logits, labels, eval_weight=None) of the model, for the last pipeline stage."""
    from ddlbench.models.language import CausalLM, lm_loss
    from ddlbench.models.vision import classification_loss
    return lm_loss if isinstance(model, CausalLM) else classification_loss


def piece_count(model_cfg) -> int:
    """How many pieces the model splits into (built on the meta device: no memory, any size)."""
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
