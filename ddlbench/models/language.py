"""Causal language models through transformers, random init (nothing downloaded): the loss, the
wrapper every framework trains, the attention kernel, and the spec a language family builds with
`causal_lm_spec` (ddlbench/models/families/ holds the families: GPT-2, Llama, Qwen3, the MoE ones)."""
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
    from torch.distributed.tensor import DTensor
    if isinstance(logits, DTensor):      # sharded over the vocabulary (loss parallel): evaluated whole
        logits = logits.full_tensor()
    logits, target = logits[:, :-1].float(), labels[:, 1:]
    per_token = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    correct = (logits.argmax(-1) == target).float()
    w = eval_weight.float()
    return torch.stack([(w * per_token.sum(1)).sum(), (w * correct.sum(1)).sum(),
                        w.sum() * target.shape[1]])


class CausalLM(nn.Module):
    """forward(input_ids, labels) -> mean next-token loss (plus the router's auxiliary loss times its
    coefficient for a Mixture-of-Experts family). `blocks` are the family's repeated blocks, the
    unit of per-block sharding, checkpointing, compile and pipeline splitting."""

    def __init__(self, net: nn.Module, family, aux_loss_coef: float = 0.0):
        super().__init__()
        self.net, self.family, self.aux_loss_coef = net, family, aux_loss_coef
        self.router_stats = None
        # modules whose `l_aux` after forward is the load-balancing loss, where a framework swapped
        # in MoE layers of its own (DeepSpeed-MoE); empty: transformers' from the router logits
        self.aux_layers: list = []
        if family.experts is not None:
            from ddlbench.models.moe import RouterStats
            self.router_stats = RouterStats(self)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                eval_weight: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                shift_labels: torch.Tensor | None = None, loss_denominator=None) -> torch.Tensor:
        """Mean next-token loss; with `eval_weight` (one weight per sequence) the weighted sums
        [loss, correct predictions, predictions] instead (evaluation, through any wrapper). With
        `shift_labels` (a part of the sequence: sequence parallelism) the targets are given already
        shifted for these positions (`position_ids`), and the loss is their summed cross-entropy /
        `loss_denominator` (the whole sequence's target count: the parts' losses add up to the mean)."""
        if shift_labels is not None:
            out = self.net(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            return F.cross_entropy(out.logits.flatten(0, 1).float(), shift_labels.flatten(), ignore_index=IGNORE,
                                   reduction="sum") / loss_denominator
        # The same loss as HF's ForCausalLM (mean over all shifted tokens), computed here so it
        # also runs on the meta device (HF's loss calls .item()) and under any wrapper.
        if attention_mask is not None and self.net.config._attn_implementation == SDPA_CAUSAL:
            raise ValueError("attention sdpa_causal builds no mask: batches with padding need model.attention=sdpa")
        aux = self.aux_loss_coef > 0 and eval_weight is None
        kw = {"output_router_logits": True} if aux and not self.aux_layers else {}
        out = self.net(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
        loss = lm_loss(out.logits, labels, eval_weight)
        from torch.distributed.tensor import DTensor
        if isinstance(loss, DTensor):    # logits sharded over the vocabulary: loss_parallel's replicated loss
            loss = loss.to_local()
        if aux:   # transformers' load_balancing_loss_func over this rank's tokens (Switch Transformer's)
            aux_loss = sum(m.l_aux for m in self.aux_layers) if self.aux_layers else out.aux_loss
            if self.router_stats is not None:
                self.router_stats.add_aux(aux_loss)
            loss = loss + self.aux_loss_coef * aux_loss
        return loss

    def blocks(self) -> list[nn.Module]:
        return self.family.blocks(self.net)


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


def takes_mask(model) -> bool:
    """Whether a batch for this built model may carry an attention mask: not under sdpa_causal,
    which builds none (LanguageModel.forward refuses one)."""
    config = getattr(getattr(model, "net", None), "config", None)
    return getattr(config, "_attn_implementation", None) != SDPA_CAUSAL


def mask_skipped(config) -> bool:
    """Whether this transformers builds no causal mask for `config` (and reads no tensor to decide):
    asked on meta with position ids, where a data-dependent check cannot run."""
    from ddlbench.models.masks import causal_mask
    hidden = torch.empty(1, 4, 8, device="meta")
    try:
        return causal_mask(config, hidden, position_ids=torch.arange(4, device="meta").unsqueeze(0)) is None
    except Exception:   # noqa: BLE001 - a check that needs the values fails on meta: the mask is built
        return False


def _attention(config, mc, device_type: str, auto: str | None = None):
    """Set the config's attention (`auto`: what the family runs where the preset says auto, if not
    attention_impl's); sdpa_causal falls back to sdpa (recorded) on a transformers whose
    create_causal_mask still reads the inputs for it."""
    requested = getattr(mc, "attention", "auto")
    impl = auto if requested == "auto" and auto else attention_impl(requested, device_type)
    if impl == SDPA_CAUSAL:
        register_sdpa_causal()
    config._attn_implementation = impl
    if impl == SDPA_CAUSAL and not mask_skipped(config):
        config._attn_implementation = "sdpa"
    return config


def _edited(build, edit) -> nn.Module:
    model = build()
    edit(model)
    return model


def causal_lm_spec(mc, family, config, class_name: str, device_type: str = "cpu",
                   count_config=None, count_model=None, attention: str | None = None) -> ModelSpec:
    """The spec of a language family: `config` (its transformers config, attention set here) built
    as `transformers.<class_name>` inside a CausalLM; `count_factory` where the run's kernels cannot
    be counted on the meta device (SDPA/flash decide their mask from tensor values: the count then
    runs eager attention, the same matmuls; `count_config` edits the copy further, e.g. an experts
    implementation the counter can see; `count_model` edits the model built from it, e.g. an experts
    module's forward that runs on meta). `attention`: the family's attention where the preset says auto."""
    config = _attention(config, mc, device_type, attention)
    aux = float(mc.moe.aux_loss_coef) if getattr(mc, "moe", None) is not None else 0.0

    def factory(cfg=config) -> nn.Module:
        import transformers
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        return CausalLM(getattr(transformers, class_name)(cfg), family, aux)

    count_factory = None
    if config._attn_implementation != "eager" or count_config is not None or count_model is not None:
        counted = copy.deepcopy(config)
        counted._attn_implementation = "eager"
        if count_config is not None:
            count_config(counted)
        count_factory = functools.partial(factory, counted)
        if count_model is not None:
            count_factory = functools.partial(_edited, count_factory, count_model)

    def sample(gen: torch.Generator) -> dict:
        ids = torch.randint(0, mc.vocab_size, (mc.seq_len,), generator=gen)
        return {"input_ids": ids, "labels": ids}

    native = {**config.to_diff_dict(), "attn_implementation": config._attn_implementation}
    if getattr(config, "_experts_implementation", None):
        native["experts_implementation"] = config._experts_implementation
    analytic = family.analytic_flops(mc, config.vocab_size) if family.analytic_flops else None
    return ModelSpec(name=mc.name, kind="language", factory=factory, sample=sample,
                     tokens_per_sample=mc.seq_len, config=native, count_factory=count_factory, family=family,
                     analytic_flops=analytic, top_k=mc.moe.top_k if getattr(mc, "moe", None) else None)
