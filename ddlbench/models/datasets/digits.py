"""scikit-learn's handwritten digits (1,797 8x8 images, 10 classes; shipped inside the package).

features=upscaled (default): upscaled bilinearly to the model's image size, grey replicated to 3
channels, scaled to [-1, 1] (for the CNN/ViT zoo). features=raw: the 1 x 8 x 8 pixels / 16, in
[0, 1], untouched (the convex yardstick: model=logreg). A fixed seeded split (`split_seed`, not
the run seed) holds out `val_fraction` for validation (0: none); `train_samples` keeps the first
k training samples of that order (e.g. 1796, so a full batch divides by 2 and 4 ranks).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ddlbench.models.datasets import Dataset, tensor_split


def digits_features(images: np.ndarray, features: str, image_size: int) -> torch.Tensor:
    """[n, 8, 8] pixel counts (0..16) -> the model's input tensor."""
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    if features == "raw":
        return x
    x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return (x.repeat(1, 3, 1, 1) - 0.5) / 0.5


def digits_dataset(dc, mc) -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # a dependency of ddlbench; only a broken install lands here
        raise RuntimeError("data=digits needs scikit-learn (pip install scikit-learn)") from exc
    d = load_digits()
    x = digits_features(d.images, dc.features, mc.image_size)
    y = torch.from_numpy(d.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(dc.split_seed).permutation(len(y)))
    n_val = int(round(len(y) * dc.val_fraction))
    val_idx, train_idx = order[:n_val], order[n_val:]
    if dc.train_samples is not None:
        train_idx = train_idx[:dc.train_samples]
    return Dataset(name="digits",
                   train=tensor_split({"images": x[train_idx], "labels": y[train_idx]}),
                   val=tensor_split({"images": x[val_idx], "labels": y[val_idx]}),
                   info={"source": "sklearn.datasets.load_digits", "samples": int(len(y)),
                         "val_fraction": dc.val_fraction, "split_seed": dc.split_seed,
                         "features": dc.features, "train_samples_cap": dc.train_samples})
