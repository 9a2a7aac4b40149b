"""Images from a user path in the ImageNet/ImageFolder layout:
    <path>/<train_dir>/<class>/<image>   and   <path>/<val_dir>/<class>/<image>
Deterministic transforms (resize to 1.14x, centre crop, ImageNet mean/std), identical for every
framework; no random augmentation, so every framework sees exactly the same pixels."""
from __future__ import annotations

from pathlib import Path

import torch

from ddlbench.models.datasets import Dataset, Split

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def class_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _split(root: Path, size: int) -> Split:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    tf = v2.Compose([v2.ToImage(), v2.Resize(int(round(size * 1.14)), antialias=True),
                     v2.CenterCrop(size), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(MEAN, STD)])
    folder = ImageFolder(str(root))

    def fetch(indices: list[int]) -> dict:
        items = [folder[i] for i in indices]
        return {"images": torch.stack([tf(img) for img, _ in items]),
                "labels": torch.tensor([label for _, label in items], dtype=torch.long)}
    return Split(size=len(folder), fetch=fetch)


def imagefolder_dataset(dc, mc, seed: int) -> Dataset:
    root = Path(dc.path)
    train, val = root / dc.train_dir, root / dc.val_dir
    if class_dirs(train) != class_dirs(val):
        raise ValueError(f"{train} and {val} have different class folders")
    return Dataset(name="imagefolder", train=_split(train, mc.image_size), val=_split(val, mc.image_size),
                   info={"path": str(root), "classes": len(class_dirs(train)),
                         "transform": "resize 1.14x, center crop, ImageNet normalisation"})
