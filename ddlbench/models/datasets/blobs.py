"""Class-conditional images with label noise: learnable, with a known floor.

Class c has a smooth random prototype image; a sample is its prototype plus Gaussian pixel noise
(`noise` << the distance between prototypes, so the true class is identifiable from the image);
its label is the true class with probability 1 - label_noise, otherwise one of the other C-1
classes uniformly. The Bayes-optimal predictor then puts 1 - e on the true class and e/(C-1) on
each other, so the best achievable cross-entropy is
    H_b(e) + e * ln(C - 1)      and the best accuracy is 1 - e.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ddlbench.models.datasets import Dataset, tensor_split


def label_noise_floor(noise: float, classes: int) -> dict:
    if noise == 0:
        return {"loss": 0.0, "accuracy": 1.0}
    h = -(noise * math.log(noise) + (1 - noise) * math.log(1 - noise))
    return {"loss": h + noise * math.log(classes - 1), "accuracy": 1.0 - noise}


def prototypes(classes: int, size: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, 11])
    coarse = torch.from_numpy(rng.standard_normal((classes, 3, 4, 4))).float()
    protos = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    return protos / protos.flatten(1).std(dim=1).view(-1, 1, 1, 1)


def make_split(protos: torch.Tensor, n: int, noise: float, label_noise: float, rng) -> dict:
    classes = protos.shape[0]
    true = torch.from_numpy(rng.integers(0, classes, n))
    images = protos[true] + noise * torch.from_numpy(rng.standard_normal(tuple(protos[true].shape))).float()
    flip = torch.from_numpy(rng.random(n) < label_noise)
    other = (true + torch.from_numpy(rng.integers(1, classes, n))) % classes
    return {"images": images, "labels": torch.where(flip, other, true), "true_class": true}


def blobs_dataset(dc, mc) -> Dataset:
    protos = prototypes(mc.num_classes, mc.image_size, dc.seed)
    splits = {}
    for key, n, stream in (("train", dc.train_samples, 0), ("val", dc.val_samples, 1)):
        t = make_split(protos, n, dc.noise, dc.label_noise, np.random.default_rng([dc.seed, stream]))
        splits[key] = tensor_split({"images": t["images"], "labels": t["labels"]})
    return Dataset(name="blobs", train=splits["train"], val=splits["val"],
                   floor=label_noise_floor(dc.label_noise, mc.num_classes),
                   info={"noise": dc.noise, "label_noise": dc.label_noise, "seed": dc.seed,
                         "floor_note": "Bayes-optimal cross-entropy/accuracy under the label noise"})
