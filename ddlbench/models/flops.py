"""Training FLOPs per sample, counted with torch.utils.flop_counter (forward + backward).

Counted on the meta device (no memory, no compute), so it is cheap for XL presets and never runs
the model on the host. Attention is counted whatever kernel the run uses: where SDPA or flash
attention picks its mask from tensor values (which meta tensors do not have), the count runs on
the same model with eager attention, the same matmuls (ModelSpec.count_factory); torch's SDPA
formula and the eager matmuls both count the full T x T scores (the non-causal convention, as
PaLM's 12*L*H*Q*T does). Model FLOPs (MFU) count one forward and one
backward; hardware FLOPs (HFU) count what runs, i.e. with activation checkpointing the block
forwards a second time, counted the same way on a model with the same checkpointing applied
(except, under selective_op with a fused attention kernel, the eager count's recomputed attention
matmuls: the policy saves the fused kernel's output, so that recompute does not run). For transformers the PaLM formula
(Chowdhery et al. 2022, appendix B: 6N + 12*L*H*Q*T per token) is reported beside it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.models.moe import param_counts as moe_param_counts
from ddlbench.models.spec import ModelSpec, count_params, example_batch


class ScoreFlops(TorchDispatchMode):
    """FLOPs (2 per multiply-add, as the flop counter counts) of the batched matmuls over a (T x T)
    tensor: eager attention's QK^T (its output T x T) and its probabilities times V (its input
    T x T, V's T rows), which a fused causal kernel computes only on and below the diagonal, and
    in backward their gradients' matmuls alike."""

    def __init__(self, seq_len: int | None):
        super().__init__()
        self.seq_len, self.flops = seq_len, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.seq_len and func is torch.ops.aten.bmm.default:
            a, b, tt = args[0], args[1], (self.seq_len, self.seq_len)
            if tuple(out.shape[-2:]) == tt or (tuple(a.shape[-2:]) == tt and b.shape[-2] == self.seq_len):
                self.flops += 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
        return out


def fused_attention(spec: ModelSpec) -> bool:
    """The run's attention is a fused kernel (SDPA, flash), not eager's matmuls and softmax."""
    return spec.kind == "language" and (spec.config or {}).get("attn_implementation", "eager") != "eager"


def _count(spec: ModelSpec, device: str, recompute_blocks: bool | str = False) -> tuple[int, float]:
    """(training FLOPs per sample, of them the (T x T) attention matmuls' per sample)."""
    from ddlbench.models import checkpointing
    with torch.device(device):
        model = (spec.count_factory or spec.factory)()
    # the run's activation checkpointing (a policy, or true = full): backward re-runs what it dropped
    checkpointing.apply(model, checkpointing.normalize(recompute_blocks))
    # vision: two samples, as BatchNorm in training mode needs more than one value per channel;
    n = 2
    batch = example_batch(spec, n, device)
    counter = FlopCounterMode(display=False)
    scores = ScoreFlops(spec.tokens_per_sample if spec.kind == "language" else None)
    with counter, scores:
        model(**batch).backward()
    return int(counter.get_total_flops()) // n, scores.flops / n


def train_flops_per_sample(spec: ModelSpec, recompute_blocks: bool | str = False) -> dict:
    """{'flops': model FLOPs, 'hardware_flops': FLOPs executed (with the recomputed forward of
    checkpointed blocks), 'method': str, 'palm_flops': int | None, 'analytic': the family's analytic
    count per sample | None, 'params': {'total', 'active'} | None}. For a Mixture-of-Experts model
    every count is of active FLOPs (each token through its top-k experts) and PaLM's 6N uses the
    active parameters."""
    flops, scores = _count(spec, "meta")
    method = "flop_counter(meta)" + (", eager attention (the same matmuls)" if spec.count_factory else "")
    if spec.top_k:
        method += ", experts on uniform routing (each token through its top-k experts: the active FLOPs)"
    hardware = flops
    if recompute_blocks not in (False, "none"):
        from ddlbench.models.checkpointing import normalize
        hardware, hw_scores = _count(spec, "meta", recompute_blocks)
        if normalize(recompute_blocks) == "selective_op" and fused_attention(spec):
            # the eager count recomputes QK^T and PV; the run's fused kernel is in the policy's save list
            hardware -= int(round(hw_scores - scores))
    palm = params = analytic = None
    if spec.kind == "language":
        c = spec.config     # the transformers config's names (a value equal to its default is left out)
        n_layer = c.get("n_layer", c.get("num_hidden_layers", 12))
        n_embd, n_head = c.get("n_embd", c.get("hidden_size", 768)), c.get("n_head", c.get("num_attention_heads", 12))
        head_dim = c.get("head_dim") or n_embd // n_head
        with torch.device("meta"):
            model = spec.build()
        params = {"total": count_params(model)}
        params["active"] = (moe_param_counts(model, spec.top_k)["active"] if spec.top_k else params["total"])
        palm = palm_train_flops_per_token(params["active"], n_layer, n_head, head_dim,
                                          spec.tokens_per_sample) * spec.tokens_per_sample
        if spec.analytic_flops:
            a = spec.analytic_flops
            # a causal kernel computes about half of the T x T scores (and their products with V)
            causal = a["total"] - a["parts"].get("attention scores", 0) / 2
            analytic = {"train_per_sample": a["total"] * spec.tokens_per_sample,
                        "causal_train_per_sample": causal * spec.tokens_per_sample,
                        "parts_per_token": a["parts"], "convention": a["convention"],
                        "counted_over_analytic": flops / (a["total"] * spec.tokens_per_sample)}
    return {"flops": flops, "hardware_flops": hardware, "method": method, "palm_flops": palm,
            "analytic": analytic, "params": params}


def palm_train_flops_per_token(params: int, n_layer: int, n_head: int, head_dim: int, seq: int) -> int:
    """PaLM appendix B: 6N + 12*L*H*Q*T training FLOPs per token."""
    return 6 * params + 12 * n_layer * n_head * head_dim * seq


# the ops whose time is their FLOPs (counted by the flop counter): matrix products, convolutions, fused attention
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm", "convolution",
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward"}


# ops that move nothing: views torch does not tag as views, allocations
_NO_TRAFFIC = {"detach", "alias", "_unsafe_view", "_reshape_alias", "empty", "empty_like", "empty_strided", "lift_fresh"}


class MemoryTraffic(TorchDispatchMode):
    """Bytes the ops other than matrix products move in device memory — norms, activations, residual adds,
    rotary embeddings, casts, a Mixture-of-Experts layer's copies of its tokens (routing, the top-k copies,
    their weighted sum), the loss over the logits — the work a GPU does at its memory's rate, not its tensor
    cores'. Two counts: `eager`, every tensor argument and output of each such op (neither a matrix product,
    `_MATMULS`, nor a view) as eager mode runs them; `fused`, what is left when every chain of them between two
    matrix products runs as one kernel (torch.compile, TransformerEngine's fused norms and activations): each
    product's activations read and written once more — its operands and result, the weights cancelling in a
    per-sample slope. With `seq_len` the (T x T) scores eager attention stands in with on meta are left out
    (and GPT-OSS's with a sink column): a fused attention kernel keeps them on chip."""

    def __init__(self, seq_len: int | None = None):
        super().__init__()
        self.seq_len, self.eager, self.fused = seq_len, 0, 0

    def _scores(self, shape, dims: tuple) -> bool:
        t = self.seq_len
        return t is not None and len(shape) in dims and shape[-2] == t and shape[-1] in (t, t + 1)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _MATMULS:     # a batched matmul's (T x T) operand is 3-D: (batch x heads, T, T)
            self.fused += sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves((args, out))
                              if isinstance(t, torch.Tensor) and not self._scores(t.shape, (3, 4)))
            return out
        if func.is_view or name in _NO_TRAFFIC:
            return out
        # the loss's gather reads one log-probability a position, not the (positions x vocabulary) it is given
        read = args[1:] if name == "nll_loss_forward" else args
        tensors = [t for t in torch.utils._pytree.tree_leaves((read, kwargs or {}, out)) if isinstance(t, torch.Tensor)]
        if len(tensors) > 1:      # a factory (arange, zeros) reads nothing; its output is written by the op using it
            self.eager += sum(t.numel() * t.element_size() for t in tensors if not self._scores(t.shape, (4,)))
        return out
