"""The causal mask transformers builds for positions 0..T-1 (no padding, no cache), called the
same way across transformers 5.x: the pipeline's stages build it for their blocks, and the model
builder asks it whether an attention implementation needs one (models/language.py)."""
from __future__ import annotations

import inspect

import torch


def causal_mask(config, hidden: torch.Tensor, position_ids: torch.Tensor | None = None, sliding: bool = False):
    """The causal mask the HF model builds for positions 0..T-1 (no padding, no cache). Without
    position_ids (the stages' call): with them HF looks for packed sequences, a data-dependent
    .item() that fails on meta, which is how models.language.mask_skipped asks whether an
    attention implementation builds a mask at all. `sliding`: the mask of a layer that attends within
the config's sliding window (GPT-OSS's every second layer). Argument names differ across transformers 5.x (5.17 on the GPU image: past_key_values
    and cache_position; 5.2x: cache): they are read off the signature."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    make = create_sliding_window_causal_mask if sliding else create_causal_mask    # sliding: the config's window
    params = inspect.signature(make).parameters
    kw = {"config": config, "attention_mask": None, "position_ids": position_ids,
          ("inputs_embeds" if "inputs_embeds" in params else "input_embeds"): hidden,
          ("cache" if "cache" in params else "past_key_values"): None}
    if "cache_position" in params:
        kw["cache_position"] = torch.arange(hidden.shape[1], device=hidden.device)
    return make(**kw)
