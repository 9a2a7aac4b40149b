"""Language models through transformers, random init: the GPT-2 family (GPT2Config) and the Llama
family (LlamaConfig: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention)."""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ddlbench.models.spec import ModelSpec

IGNORE = -100   # torch's default ignore_index


def lm_loss(logits: torch.Tensor, labels: torch.Tensor,
            eval_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy (HF ForCausalLM's loss); with `eval_weight` (one weight per
    sequence) the weighted sums [loss, correct predictions, predictions] (evaluation)."""
    if eval_weight is None:
        # labels shifted instead of logits: logits[:, :-1] would copy the whole (B, T, vocab) tensor
        # before the fp32 upcast copies it again (Llama 1B at micro-batch 4: 2 GiB at bf16); the last
        # position is ignored, so the mean is over the same B x (T-1) tokens
        target = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE)
    logits, target = logits[:, :-1].float(), labels[:, 1:]
    per_token = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    correct = (logits.argmax(-1) == target).float()
    w = eval_weight.float()
    return torch.stack([(w * per_token.sum(1)).sum(), (w * correct.sum(1)).sum(),
                        w.sum() * target.shape[1]])


class CausalLM(nn.Module):
    """forward(input_ids, labels) -> mean next-token loss. `blocks` are the transformer blocks,
    the unit of per-block sharding / pipeline splitting."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                eval_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token loss; with `eval_weight` (one weight per sequence) the weighted sums
        [loss, correct predictions, predictions] instead (evaluation, through any wrapper)."""
        # The same loss as HF's ForCausalLM (mean over all shifted tokens), computed here so it
        # also runs on the meta device (HF's loss calls .item()) and under any wrapper.
        if attention_mask is not None and self.net.config._attn_implementation == SDPA_CAUSAL:
            raise ValueError("attention sdpa_causal builds no mask: batches with padding need model.attention=sdpa")
        logits = self.net(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return lm_loss(logits, labels, eval_weight)

    def blocks(self) -> list[nn.Module]:
        if hasattr(self.net, "transformer"):     # GPT-2
            return list(self.net.transformer.h)
        return list(self.net.model.layers)       # Llama


SDPA_CAUSAL = "sdpa_causal"


def attention_impl(requested: str, device_type: str) -> str:
    """transformers' attn_implementation: eager on CPU, sdpa_causal on CUDA, unless set."""
    if requested != "auto":
        return requested
    return SDPA_CAUSAL if device_type == "cuda" else "eager"


def register_sdpa_causal() -> None:
    """transformers' own SDPA attention function under a name its masks module has no mask function
    for: create_causal_mask then returns no mask without reading a tensor, and SDPA runs with
    is_causal=True (the flash/cuDNN kernels, as with `sdpa` on full-length batches). With `sdpa`
    every forward reads a tensor's value on the host to decide the mask (the position ids checked
    for packed sequences, or an all-ones mask checked for padding): a device sync per forward,
    which with gradient accumulation drains the GPU's queue before each micro-batch. Only for
    batches without padding or packing, as every ddlbench dataset is (CausalLM refuses a mask)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    AttentionInterface.register(SDPA_CAUSAL, sdpa_attention_forward)


def mask_skipped(config) -> bool:
    """Whether this transformers builds no causal mask for `config` (and reads no tensor to decide):
    asked on meta with position ids, where a data-dependent check cannot run."""
    from ddlbench.models.masks import causal_mask
    hidden = torch.empty(1, 4, 8, device="meta")
    try:
        return causal_mask(config, hidden, position_ids=torch.arange(4, device="meta").unsqueeze(0)) is None
    except Exception:   # noqa: BLE001 - a check that needs the values fails on meta: the mask is built
        return False


def _attention(config, mc, device_type: str):
    """Set the config's attention; sdpa_causal falls back to sdpa (recorded) on a transformers
    whose create_causal_mask still reads the inputs for it."""
    impl = attention_impl(getattr(mc, "attention", "auto"), device_type)
    if impl == SDPA_CAUSAL:
        register_sdpa_causal()
    config._attn_implementation = impl
    if impl == SDPA_CAUSAL and not mask_skipped(config):
        config._attn_implementation = "sdpa"
    return config


def gpt2_activation(requested: str, device_type: str) -> str:
    """auto: gelu_pytorch_tanh on CUDA (one fused kernel; autocast runs gelu_new's pow in fp32),
    GPT-2's own gelu_new on CPU (the numbers the CPU suite and reports were measured with)."""
    if requested != "auto":
        return requested
    return "gelu_pytorch_tanh" if device_type == "cuda" else "gelu_new"


def padded_vocab(vocab_size: int, pad_to, device_type: str) -> int:
    """The embedding rows: vocab_size rounded up to a multiple of pad_to (auto: 64 on CUDA, 1 on CPU)."""
    multiple = (64 if device_type == "cuda" else 1) if pad_to == "auto" else int(pad_to)
    return -(-vocab_size // multiple) * multiple


def gpt2_config(mc, device_type: str = "cpu"):
    from transformers import GPT2Config
    return GPT2Config(
        n_layer=mc.n_layer, n_embd=mc.n_embd, n_head=mc.n_head,
        vocab_size=padded_vocab(mc.vocab_size, getattr(mc, "pad_vocab_to", "auto"), device_type),
        activation_function=gpt2_activation(getattr(mc, "activation", "auto"), device_type),
        n_positions=mc.seq_len, resid_pdrop=mc.dropout, embd_pdrop=mc.dropout,
        attn_pdrop=mc.dropout, bos_token_id=mc.vocab_size - 1, eos_token_id=mc.vocab_size - 1,
        loss_type="ForCausalLM",
    )


def llama_config(mc, device_type: str = "cpu"):
    """Llama 3.x shapes from the preset (random init); rope scaling is left out: it changes the
    rotary frequencies past the original context, not the cost."""
    from transformers import LlamaConfig
    return LlamaConfig(
        num_hidden_layers=mc.n_layer, hidden_size=mc.n_embd, num_attention_heads=mc.n_head,
        num_key_value_heads=mc.n_kv_head, intermediate_size=mc.intermediate_size,
        vocab_size=padded_vocab(mc.vocab_size, getattr(mc, "pad_vocab_to", "auto"), device_type),
        max_position_embeddings=mc.seq_len, rope_theta=mc.rope_theta, rms_norm_eps=mc.rms_norm_eps or 1e-5,
        attention_dropout=mc.dropout, tie_word_embeddings=bool(mc.tie_embeddings), hidden_act="silu",
        bos_token_id=mc.vocab_size - 1, eos_token_id=mc.vocab_size - 1,
    )


def language_spec(mc, device_type: str = "cpu") -> ModelSpec:
    """The family's config, its causal-LM class, and `count_factory` where SDPA/flash attention
    decides its mask from tensor values (the FLOP count then runs eager attention on meta)."""
    if mc.family == "llama":
        config, class_name = llama_config(mc, device_type), "LlamaForCausalLM"
    else:
        config, class_name = gpt2_config(mc, device_type), "GPT2LMHeadModel"
    config = _attention(config, mc, device_type)

    def factory(cfg=config) -> nn.Module:
        import transformers
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        return CausalLM(getattr(transformers, class_name)(cfg))

    count_factory = None
    if config._attn_implementation != "eager":   # SDPA/flash decide their mask from tensor values
        eager = copy.deepcopy(config)
        eager._attn_implementation = "eager"
        count_factory = functools.partial(factory, eager)

    def sample(gen: torch.Generator) -> dict:
        ids = torch.randint(0, mc.vocab_size, (mc.seq_len,), generator=gen)
        return {"input_ids": ids, "labels": ids}

    return ModelSpec(name=mc.name, kind="language", factory=factory, sample=sample,
                     tokens_per_sample=mc.seq_len,
                     config={**config.to_diff_dict(), "attn_implementation": config._attn_implementation},
                     count_factory=count_factory)
