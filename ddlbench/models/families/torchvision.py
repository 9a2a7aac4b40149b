"""torchvision image classifiers (`kind: vision`, model.arch): ResNet-18/50/152, VGG-16, ViT-B/16,
a configurable ViT, and the linear classifier `logreg` (ddlbench/models/vision.py builds them)."""
from __future__ import annotations

import torch
from torch import nn

from ddlbench.models.family import Family, TensorParallelPlan


def spec(mc, device_type: str = "cpu"):
    from ddlbench.models.vision import vision_spec
    return vision_spec(mc, FAMILY, device_type)


def blocks(net: nn.Module) -> list[nn.Module]:
    """ResNet stages, ViT encoder layers, VGG features + classifier; none for logreg."""
    from ddlbench.models.vision import LinearClassifier
    if isinstance(net, LinearClassifier):
        return []
    if hasattr(net, "layer1"):
        return [net.layer1, net.layer2, net.layer3, net.layer4]
    if hasattr(net, "encoder"):
        return list(net.encoder.layers)
    return [net.features, net.classifier]


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


def pieces(net: nn.Module) -> list[nn.Module]:
    """ViT: Embed (patchify, class token, position embedding, dropout) | encoder layers | Head;
    ResNet: Stem (conv, bn, relu, maxpool) | one piece per residual block | Head (pool, fc);
    VGG: the feature extractor cut after each max-pool | Head (pool, classifier); logreg: one piece."""
    from ddlbench.models.vision import LinearClassifier
    if isinstance(net, LinearClassifier):
        return [net]                 # one piece: nothing to pipeline
    if hasattr(net, "encoder"):      # ViT
        return [_VitEmbed(net), *net.encoder.layers, _VitHead(net)]
    if hasattr(net, "layer1"):       # ResNet
        stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        stages = [b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer]
        return [stem, *stages, _PoolHead(net.avgpool, net.fc)]
    groups, current = [], []         # VGG: cut the features after each max-pool
    for layer in net.features:
        current.append(layer)
        if isinstance(layer, nn.MaxPool2d):
            groups.append(nn.Sequential(*current))
            current = []
    if current:
        groups.append(nn.Sequential(*current))
    return [*groups, _PoolHead(net.avgpool, net.classifier)]


def vit_block(block: nn.Module, mesh) -> None:
    """nn.MultiheadAttention becomes attention on local heads (fused in_proj rows permuted per rank)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ddlbench.models.tensor_parallel import LocalHeadsAttention
    block.self_attention = LocalHeadsAttention(block.self_attention, mesh.size())
    parallelize_module(block, mesh, {"self_attention.in_proj": ColwiseParallel(),
                                     "self_attention.out_proj": RowwiseParallel(),
                                     "mlp.0": ColwiseParallel(), "mlp.3": RowwiseParallel()})


def tp_widths(mc) -> dict:
    """Tensor parallelism has a plan for ViT only (raises for the convolutional nets)."""
    if mc.vit is None:
        raise ValueError(f"model.arch '{mc.arch}' has no tensor-parallel plan (of the torchvision models "
                         "only ViT has one)")
    v = mc.vit
    return {"model.vit.num_heads": v.num_heads, "model.vit.hidden_dim": v.hidden_dim, "model.vit.mlp_dim": v.mlp_dim}


FAMILY = Family(
    name="torchvision", kind="vision", spec=spec,
    modules=lambda mc: ("ddlbench.models.vision", "torchvision.models"),
    blocks=blocks, pieces=pieces,
    tensor_parallel=TensorParallelPlan(
        "EncoderBlock", vit_block,
        {"self_attention.in_proj": True, "self_attention.out_proj": False, "mlp.0": True, "mlp.3": False},
        {"self_attention.in_proj": "ColwiseParallel (MultiheadAttention -> LocalHeadsAttention, rows permuted)",
         "self_attention.out_proj": "RowwiseParallel", "mlp.0": "ColwiseParallel", "mlp.3": "RowwiseParallel"}),
    tp_widths=tp_widths,
)
