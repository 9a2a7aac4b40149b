"""scikit-learn's handwritten digits (1,797 8x8 images, 10 classes; shipped inside the package),
upscaled bilinearly to the model's image size, grey replicated to 3 channels, scaled to [-1, 1].
A fixed seeded split (`split_seed`, not the run seed) holds out `val_fraction` for validation."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from models.datasets import Dataset, tensor_split


def digits_dataset(dc, mc) -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # a dependency of ddlbench; only a broken install lands here
        raise RuntimeError("data=digits needs scikit-learn (pip install scikit-learn)") from exc
    d = load_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(mc.image_size, mc.image_size), mode="bilinear", align_corners=False)
    x = (x.repeat(1, 3, 1, 1) - 0.5) / 0.5
    y = torch.from_numpy(d.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(dc.split_seed).permutation(len(y)))
    n_val = int(round(len(y) * dc.val_fraction))
    val_idx, train_idx = order[:n_val], order[n_val:]
    return Dataset(name="digits",
                   train=tensor_split({"images": x[train_idx], "labels": y[train_idx]}),
                   val=tensor_split({"images": x[val_idx], "labels": y[val_idx]}),
                   info={"source": "sklearn.datasets.load_digits", "samples": int(len(y)),
                         "val_fraction": dc.val_fraction, "split_seed": dc.split_seed})
