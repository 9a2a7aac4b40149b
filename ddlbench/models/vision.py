"""Vision models from torchvision: ResNet-18/50/152, VGG-16, ViT-B/16 and a tiny ViT; and a
linear classifier (multinomial logistic regression, `arch: logreg`), the convex yardstick."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddlbench.models.spec import ModelSpec


def classification_loss(logits: torch.Tensor, labels: torch.Tensor,
                        eval_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy; with `eval_weight` the weighted sums [loss, correct, samples]."""
    if eval_weight is None:
        return F.cross_entropy(logits, labels)
    w, logits = eval_weight.float(), logits.float()
    loss = F.cross_entropy(logits, labels, reduction="none")
    return torch.stack([(w * loss).sum(), (w * (logits.argmax(-1) == labels).float()).sum(), w.sum()])


class LinearClassifier(nn.Module):
    """Multinomial logistic regression on the flattened input: logits = W x + b."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1))


class Classifier(nn.Module):
    """A torchvision classifier that computes its own loss; `channels_last`: images in NHWC (the
    weights are put in that layout when the model is built)."""

    def __init__(self, net: nn.Module, family, channels_last: bool = False):
        super().__init__()
        self.net, self.family, self.channels_last = net, family, channels_last

    def forward(self, images: torch.Tensor, labels: torch.Tensor,
                eval_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Mean cross-entropy; with `eval_weight` the weighted sums [loss, correct, samples]."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return classification_loss(self.net(images), labels, eval_weight)

    def blocks(self) -> list[nn.Module]:
        return self.family.blocks(self.net)


def _net(mc) -> nn.Module:
    if mc.arch == "logreg":
        return LinearClassifier(mc.channels * mc.image_size ** 2, mc.num_classes)
    import torchvision.models as tvm
    if mc.arch == "vit":
        v = mc.vit
        return tvm.VisionTransformer(image_size=mc.image_size, patch_size=v.patch_size,
                                     num_layers=v.num_layers, num_heads=v.num_heads,
                                     hidden_dim=v.hidden_dim, mlp_dim=v.mlp_dim,
                                     num_classes=mc.num_classes)
    if mc.arch == "vit_b_16":
        return tvm.vit_b_16(weights=None, image_size=mc.image_size, num_classes=mc.num_classes)
    return getattr(tvm, mc.arch)(weights=None, num_classes=mc.num_classes)


def use_channels_last(requested, arch: str, device_type: str) -> bool:
    """auto: NHWC on CUDA for convolutional nets (NVIDIA's recipe with tensor cores); never for
    ViT (its one convolution is the patch embedding) or logreg."""
    if requested != "auto":
        return bool(requested)
    return device_type == "cuda" and arch not in ("vit", "vit_b_16", "logreg")


def vision_spec(mc, family, device_type: str = "cpu") -> ModelSpec:
    channels_last = use_channels_last(getattr(mc, "channels_last", "auto"), mc.arch, device_type)

    def factory() -> nn.Module:
        model = Classifier(_net(mc), family, channels_last)
        return model.to(memory_format=torch.channels_last) if channels_last else model

    def sample(gen: torch.Generator) -> dict:
        label = torch.randint(0, mc.num_classes, (), generator=gen)
        return {"images": torch.randn(mc.channels, mc.image_size, mc.image_size, generator=gen), "labels": label}

    config = {"arch": mc.arch, "image_size": mc.image_size, "num_classes": mc.num_classes,
              "channels": mc.channels, "channels_last": channels_last}
    if mc.vit is not None:
        config["vit"] = mc.vit.model_dump()
    return ModelSpec(name=mc.name, kind="vision", factory=factory, sample=sample,
                     tokens_per_sample=None, config=config, family=family)
