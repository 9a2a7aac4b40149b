"""Finite datasets with a train and a held-out validation split (statistical efficiency).

Nothing is downloaded at run time. Every dataset is a pair of `Split`s (indices -> batch) plus
its known quality floor where one exists (`floor.loss` in nats per prediction,
`floor.accuracy`), so a report can say how close a run came to the best achievable.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass
class Split:
    size: int
    fetch: Callable[[list[int]], dict]   # list of sample indices -> dict of stacked CPU tensors

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, indices: list[int]) -> dict:  # DataLoader(batch_size=None) calls this
        return self.fetch(list(indices))


def tensor_split(tensors: dict[str, torch.Tensor]) -> Split:
    size = len(next(iter(tensors.values())))

    def fetch(indices: list[int]) -> dict:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {k: v.index_select(0, idx) for k, v in tensors.items()}
    return Split(size=size, fetch=fetch)


@dataclass
class Dataset:
    name: str
    train: Split
    val: Split
    floor: dict = field(default_factory=lambda: {"loss": None, "accuracy": None})
    info: dict = field(default_factory=dict)   # how it was made; recorded in result.json


def build_dataset(data_cfg, model_cfg, seed: int) -> Optional[Dataset]:
    """The run's dataset, or None for `data=synthetic` (random samples, no validation split)."""
    name = data_cfg.name
    if name == "synthetic":
        return None
    if name == "markov":
        from ddlbench.models.datasets.markov import markov_dataset
        return markov_dataset(data_cfg, model_cfg)
    if name == "blobs":
        from ddlbench.models.datasets.blobs import blobs_dataset
        return blobs_dataset(data_cfg, model_cfg)
    if name == "digits":
        from ddlbench.models.datasets.digits import digits_dataset
        return digits_dataset(data_cfg, model_cfg)
    if name == "imagefolder":
        from ddlbench.models.datasets.imagefolder import imagefolder_dataset
        return imagefolder_dataset(data_cfg, model_cfg, seed)
    if name == "text":
        from ddlbench.models.datasets.text import text_dataset
        return text_dataset(data_cfg, model_cfg)
    raise ValueError(f"unknown dataset {name!r}")
