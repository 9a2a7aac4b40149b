"""A raw text corpus from a user path in the Wikitext-103 layout (`wiki.train.tokens`,
`wiki.valid.tokens`), cut into non-overlapping windows of seq_len tokens.

Tokenizers, both offline: `byte` (UTF-8 bytes, ids 0..255, needs vocab_size >= 256) or `gpt2`
(GPT-2 BPE from `tokenizer_dir` holding vocab.json + merges.txt; needs vocab_size >= 50257).
Token ids are cached under ~/.cache/ddlbench/tokens keyed by file path, size, mtime and
tokenizer, written atomically, so ranks and later runs reuse them.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from ddlbench.models.datasets import Dataset, Split

CACHE = Path(os.path.expanduser("~/.cache/ddlbench/tokens"))


def byte_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint8).astype(np.int32)


def gpt2_tokens(path: Path, tokenizer_dir: str) -> np.ndarray:
    """GPT-2's byte-level BPE (the `tokenizers` library, as HF's fast GPT-2 tokenizer uses)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = Path(tokenizer_dir)
    tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ids: list[int] = []
    with open(path, encoding="utf-8") as f:
        while chunk := f.readlines(1 << 20):   # ~1 MiB of whole lines at a time
            ids.extend(tok.encode("".join(chunk)).ids)
    return np.asarray(ids, dtype=np.int32)


def cached_tokens(path: Path, tokenizer: str, tokenizer_dir) -> np.ndarray:
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{tokenizer}|{tokenizer_dir}".encode()).hexdigest()
    out = CACHE / f"{key[:20]}.npy"
    if out.exists():
        return np.load(out, mmap_mode="r")
    ids = byte_tokens(path) if tokenizer == "byte" else gpt2_tokens(path, tokenizer_dir)
    CACHE.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE, suffix=".npy.tmp")
    with os.fdopen(fd, "wb") as f:
        np.save(f, ids)
    os.replace(tmp, out)
    return ids


def window_split(ids: np.ndarray, seq_len: int) -> Split:
    n = len(ids) // seq_len

    def fetch(indices: list[int]) -> dict:
        x = torch.from_numpy(np.stack([np.asarray(ids[i * seq_len:(i + 1) * seq_len]) for i in indices]).astype(np.int64))
        return {"input_ids": x, "labels": x}
    return Split(size=n, fetch=fetch)


def text_dataset(dc, mc) -> Dataset:
    root = Path(dc.path)
    splits = {key: window_split(cached_tokens(root / name, dc.tokenizer, dc.tokenizer_dir), mc.seq_len)
              for key, name in (("train", dc.train_file), ("val", dc.val_file))}
    return Dataset(name="text", train=splits["train"], val=splits["val"],
                   info={"path": str(root), "tokenizer": dc.tokenizer, "seq_len": mc.seq_len})
