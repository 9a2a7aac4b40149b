"""A seeded first-order Markov source over `states` tokens: learnable, with a known floor.

Transition rows are Dirichlet(concentration) draws; the first token of every sequence is drawn
from the stationary distribution pi, so every position is stationary. A model that predicts
token t+1 from tokens <= t can do no better than the entropy rate
    H = sum_i pi_i * H(P_i)   (nats per predicted token)
and no more accurately than sum_i pi_i * max_j P_ij. Those are `floor.loss` / `floor.accuracy`.
"""
from __future__ import annotations

import numpy as np
import torch

from ddlbench.models.datasets import Dataset, tensor_split


def transition_matrix(states: int, concentration: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 7])
    return rng.dirichlet(np.full(states, concentration), size=states)


def stationary(P: np.ndarray) -> np.ndarray:
    """Left eigenvector of P for eigenvalue 1, normalised (P has positive rows: unique)."""
    vals, vecs = np.linalg.eig(P.T)
    v = np.real(vecs[:, np.argmin(np.abs(vals - 1.0))])
    return v / v.sum()


def entropy_rate(P: np.ndarray, pi: np.ndarray) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        h_rows = -np.where(P > 0, P * np.log(P), 0.0).sum(axis=1)
    return float(pi @ h_rows)


def sample_chains(P: np.ndarray, pi: np.ndarray, n: int, length: int, rng) -> np.ndarray:
    cdf = np.cumsum(P, axis=1)
    out = np.empty((n, length), dtype=np.int64)
    out[:, 0] = np.minimum(np.searchsorted(np.cumsum(pi), rng.random(n)), len(pi) - 1)
    for t in range(1, length):
        u = rng.random(n)[:, None]
        out[:, t] = np.minimum((u > cdf[out[:, t - 1]]).sum(axis=1), len(pi) - 1)
    return out


def markov_dataset(dc, mc) -> Dataset:
    P = transition_matrix(dc.states, dc.concentration, dc.seed)
    pi = stationary(P)
    splits = {}
    for key, n, stream in (("train", dc.train_samples, 0), ("val", dc.val_samples, 1)):
        ids = torch.from_numpy(sample_chains(P, pi, n, mc.seq_len, np.random.default_rng([dc.seed, stream])))
        splits[key] = tensor_split({"input_ids": ids, "labels": ids})
    floor = {"loss": entropy_rate(P, pi), "accuracy": float(pi @ P.max(axis=1))}
    return Dataset(name="markov", train=splits["train"], val=splits["val"], floor=floor,
                   info={"states": dc.states, "concentration": dc.concentration, "seed": dc.seed,
                         "floor_note": "entropy rate of the source (nats/token); accuracy of the "
                                       "Bayes-optimal next-token guess"})
