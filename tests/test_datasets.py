"""Datasets, their known floors (hand-computed), and the world-size-independent sample order."""
import json
import math
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from ddlbench.models.datasets import build_dataset
from ddlbench.models.datasets.blobs import label_noise_floor, make_split, prototypes
from ddlbench.models.datasets.markov import entropy_rate, sample_chains, stationary
from ddlbench.models.loader import epoch_order, eval_shards, rank_batches

GPT = NS(kind="language", seq_len=16, vocab_size=256, name="gpt2_tiny")
VISION = NS(kind="vision", image_size=16, num_classes=10, name="resnet18_tiny")


def test_markov_floor_matches_hand_computation():
    # Two states: P = [[0.9, 0.1], [0.5, 0.5]] -> pi = (5/6, 1/6);
    # H = 5/6 * H(0.9, 0.1) + 1/6 * ln 2 = 5/6 * 0.325083 + 0.115525 = 0.386428 nats
    P = np.array([[0.9, 0.1], [0.5, 0.5]])
    pi = stationary(P)
    assert pi == pytest.approx([5 / 6, 1 / 6])
    assert entropy_rate(P, pi) == pytest.approx(5 / 6 * 0.3250829734 + math.log(2) / 6, rel=1e-9)


def test_markov_samples_follow_the_transitions():
    P = np.array([[0.9, 0.1], [0.5, 0.5]])
    x = sample_chains(P, stationary(P), 2000, 50, np.random.default_rng(0))
    prev, nxt = x[:, :-1].ravel(), x[:, 1:].ravel()
    assert np.mean(nxt[prev == 0] == 1) == pytest.approx(0.1, abs=0.01)
    assert np.mean(x[:, 0] == 0) == pytest.approx(5 / 6, abs=0.03)  # first token ~ pi


def test_markov_dataset_is_seeded_and_in_vocab():
    dc = NS(name="markov", states=8, concentration=0.2, train_samples=64, val_samples=16, seed=3)
    a, b = build_dataset(dc, GPT, 0), build_dataset(dc, GPT, 99)   # run seed does not change the task
    ta, tb = a.train[list(range(64))], b.train[list(range(64))]
    assert torch.equal(ta["input_ids"], tb["input_ids"]) and ta["input_ids"].max() < 8
    assert ta["input_ids"].shape == (64, 16) and a.val.size == 16
    assert 0 < a.floor["loss"] < math.log(8) and 1 / 8 < a.floor["accuracy"] < 1


def test_blobs_floor_and_separability():
    # H_b(0.1) + 0.1 ln 9 = 0.325083 + 0.219722 = 0.544805; best accuracy 0.9
    f = label_noise_floor(0.1, 10)
    assert f["loss"] == pytest.approx(0.3250829734 + 0.1 * math.log(9), rel=1e-9)
    assert f["accuracy"] == 0.9
    protos = prototypes(10, 16, 1234)
    s = make_split(protos, 500, 0.5, 0.1, np.random.default_rng(0))
    dist = ((s["images"].flatten(1)[:, None] - protos.flatten(1)[None]) ** 2).sum(-1)
    assert (dist.argmin(1) == s["true_class"]).float().mean() == 1.0   # true class identifiable
    assert (s["labels"] != s["true_class"]).float().mean() == pytest.approx(0.1, abs=0.03)


def test_digits_real_images_upscaled():
    d = build_dataset(NS(name="digits", val_fraction=0.2, split_seed=0, features="upscaled", train_samples=None),
                      VISION, 0)
    assert d.train.size + d.val.size == 1797 and d.val.size == 359
    b = d.val[[0, 1, 2]]
    assert b["images"].shape == (3, 3, 16, 16) and b["labels"].max() <= 9
    assert -1.0 <= float(b["images"].min()) and float(b["images"].max()) <= 1.0


def test_text_byte_tokenizer_windows(tmp_path, monkeypatch):
    monkeypatch.setattr("ddlbench.models.datasets.text.CACHE", tmp_path / "cache")
    (tmp_path / "wiki.train.tokens").write_bytes(bytes(range(256)) * 2)   # 512 bytes -> 32 windows
    (tmp_path / "wiki.valid.tokens").write_text("hello world, hello tokens!")
    dc = NS(name="text", path=str(tmp_path), train_file="wiki.train.tokens", val_file="wiki.valid.tokens",
            tokenizer="byte", tokenizer_dir=None)
    d = build_dataset(dc, GPT, 0)
    assert d.train.size == 32 and d.val.size == 1
    assert d.train[[1]]["input_ids"].tolist() == [list(range(16, 32))]
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2   # cached for the next run
    assert build_dataset(dc, GPT, 0).train[[1]]["input_ids"].tolist() == [list(range(16, 32))]


def bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable-unicode map (from the GPT-2 release)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_text_gpt2_bpe_from_local_files(tmp_path, monkeypatch):
    monkeypatch.setattr("ddlbench.models.datasets.text.CACHE", tmp_path / "cache")
    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab["he"] = 256
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh e\n")
    (tmp_path / "wiki.train.tokens").write_text("hehe" * 64)
    (tmp_path / "wiki.valid.tokens").write_text("hehe" * 16)
    dc = NS(name="text", path=str(tmp_path), train_file="wiki.train.tokens", val_file="wiki.valid.tokens",
            tokenizer="gpt2", tokenizer_dir=str(tmp_path))
    d = build_dataset(dc, GPT, 0)
    assert d.train.size == 8 and d.train[[0]]["input_ids"].unique().tolist() == [256]  # merged "he"


def test_imagefolder_reads_real_files(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c, colour in enumerate(((255, 0, 0), (0, 0, 255))):
            (tmp_path / split / f"class{c}").mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (20, 24), colour).save(tmp_path / split / f"class{c}" / f"{i}.png")
    dc = NS(name="imagefolder", path=str(tmp_path), train_dir="train", val_dir="val")
    d = build_dataset(dc, NS(kind="vision", image_size=16, num_classes=2), 0)
    b = d.train[[0, 5]]
    assert b["images"].shape == (2, 3, 16, 16) and b["labels"].tolist() == [0, 1]
    assert b["images"][0, 0].mean() > b["images"][0, 2].mean()   # red stays red


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_global_batches_do_not_depend_on_world_size(dp):
    size, gb = 100, 8
    one = rank_batches(size, 5, 1, gb, 0, gb)
    local = gb // dp
    parts = [rank_batches(size, 5, 1, gb, r, local) for r in range(dp)]
    for b in range(size // gb):
        assert sum((p[b] for p in parts), []) == one[b]
    seen = [i for batch in one for i in batch]
    assert len(seen) == len(set(seen)) == (size // gb) * gb   # no duplicates in an epoch
    assert epoch_order(size, 5, 1) != epoch_order(size, 5, 2)


@pytest.mark.parametrize("size,dp,batch", [(10, 1, 4), (10, 2, 3), (7, 4, 2), (8, 2, 4)])
def test_eval_shards_count_every_sample_once(size, dp, batch):
    counted = {}
    n_batches = set()
    for r in range(dp):
        shards = eval_shards(size, dp, r, batch)
        n_batches.add(len(shards))
        for idx, w in shards:
            assert len(idx) == batch
            for i, wi in zip(idx, w):
                counted[i] = counted.get(i, 0) + wi
    assert counted == {i: 1.0 for i in range(size)}
    assert len(n_batches) == 1   # every rank runs the same number of forwards (FSDP/ZeRO-3)


def test_dataloader_workers_give_the_same_batches(tmp_path):
    import torch

    from ddlbench.models.datasets import tensor_split
    from ddlbench.models.loader import TrainStream

    split = tensor_split({"x": torch.arange(40).view(20, 2), "y": torch.arange(20)})
    direct = TrainStream(split, 1, 8, 1, 4, torch.device("cpu"), num_workers=0)
    workers = TrainStream(split, 1, 8, 1, 4, torch.device("cpu"), num_workers=2)
    a, b = list(direct.epoch(0)), list(workers.epoch(0))
    assert len(a) == len(b) == 2
    assert all(torch.equal(p["y"], q["y"]) and torch.equal(p["x"], q["x"]) for p, q in zip(a, b))
