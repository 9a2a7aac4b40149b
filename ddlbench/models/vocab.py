"""The embedding table's rows (shared by every language family, imported by none of the models'
other modules)."""
from __future__ import annotations


def padded_vocab(vocab_size: int, pad_to, device_type: str) -> int:
    """The embedding rows: vocab_size rounded up to a multiple of pad_to (auto: 64 on CUDA, 1 on CPU)."""
    multiple = (64 if device_type == "cuda" else 1) if pad_to == "auto" else int(pad_to)
    return -(-vocab_size // multiple) * multiple
