"""Mixture-of-Experts pieces shared by the MoE families (ddlbench/models/families/qwen3_moe.py,
mixtral.py), on transformers' own MoE layers: a router (TopKRouter: logits -> top-k weights and
expert indices) and experts stored as 3-D tensors (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I])
whose forward(hidden [N, H], top_k_index [N, k], top_k_weights [N, k]) runs the chosen experts
implementation (transformers' integrations/moe.py: the per-expert loop `eager`, `grouped_mm`,
`batched_mm`). Routing is dropless (no capacity, no dropped tokens).

Here: the experts implementation a run uses, the analytic FLOPs of an MoE layer, the parameter
counts (total and active), the router's statistics, and expert parallelism (torchtitan's layout:
tokens dispatched to the rank holding their expert by all-to-all, combined back by all-to-all).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


def experts_implementation(requested: str, device_type: str) -> str:
    """auto: grouped_mm on CUDA (torch's grouped GEMM, one kernel for all experts), the per-expert
    loop (`eager`) where there is no grouped GEMM kernel (CPU); the same for every framework."""
    if requested != "auto":
        return requested
    return "grouped_mm" if device_type == "cuda" else "eager"


def qwen_moe_kwargs(mc, device_type: str) -> dict:
    """The config keywords of the Qwen MoE families (Qwen2MoeConfig, Qwen3MoeConfig): the decoder's,
    and every layer sparse with the preset's experts."""
    from ddlbench.models import decoder
    m = mc.moe
    kw = decoder.config_kwargs(mc, device_type)
    kw.pop("intermediate_size", None)   # dense layers only (mlp_only_layers): none here
    return {**kw, "num_experts": m.num_experts, "num_experts_per_tok": m.top_k,
            "moe_intermediate_size": m.intermediate_size, "norm_topk_prob": m.norm_topk_prob,
            "router_aux_loss_coef": m.aux_loss_coef, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "experts_implementation": experts_implementation(m.experts_implementation, device_type)}


UNIFORM = "ddlbench_uniform"


def uniform_experts_forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """An experts implementation for the meta device (the FLOP count, the memory profile), where
    the per-expert loop (nonzero) and grouped_mm's kernel cannot run: the N x k (token, expert)
    rows, copied as the loop and grouped_mm copy them, are split evenly over the experts (uniform
    routing: the shapes do not depend on values) and each chunk runs its expert's SwiGLU. The same
    matmuls as what runs (every row through one expert: the active FLOPs) and the same tensors
    saved for backward, whatever the routing."""
    n, k = top_k_index.shape
    rows = hidden.repeat_interleave(k, dim=0)
    experts = self.num_experts
    if (n * k) % experts == 0:      # equal chunks: one batched matmul a projection (the same FLOPs, E x fewer ops)
        gate, up = torch.bmm(rows.view(experts, n * k // experts, -1), self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
        out = torch.bmm(self.act_fn(gate) * up, self.down_proj.transpose(1, 2)).reshape(n * k, -1)
    else:
        sizes = [len(range(e, n * k, experts)) for e in range(experts)]
        outs = []
        for e, chunk in enumerate(rows.split(sizes)):
            gate, up = F.linear(chunk, self.gate_up_proj[e]).chunk(2, dim=-1)
            outs.append(F.linear(self.act_fn(gate) * up, self.down_proj[e]))
        out = torch.cat(outs)
    out = out * top_k_weights.reshape(-1, 1).to(hidden.dtype)
    return out.view(n, k, -1).sum(1)


def count_config(config) -> None:
    """The configuration the FLOP count and the memory profile build on the meta device."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    if UNIFORM not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(UNIFORM, uniform_experts_forward)
    config._experts_implementation = UNIFORM


def layer_flops(mc) -> dict:
    """Forward FLOPs per token of one MoE layer (2 per multiply-add): the router (n_embd x experts),
    top_k routed experts (SwiGLU: gate, up, down, each n_embd x moe.intermediate_size), and a shared
    expert where there is one (SwiGLU of moe.shared_intermediate_size, and its sigmoid gate n_embd x 1)."""
    m = mc.moe
    out = {"router": 2 * mc.n_embd * m.num_experts, "routed experts": m.top_k * 2 * 3 * mc.n_embd * m.intermediate_size}
    if m.shared_intermediate_size:
        out["shared expert"] = 2 * 3 * mc.n_embd * m.shared_intermediate_size + 2 * mc.n_embd
    return out


def no_shared_expert(family: str):
    """A family check: its MoE layers have no shared expert (nor DeepSeek-V3's routing)."""
    def check(mc) -> list[str]:
        errors = not_deepseek_routing(family)(mc)
        if mc.moe is not None and mc.moe.shared_intermediate_size:
            errors.append(f"model.moe.shared_intermediate_size: family {family} has no shared expert (qwen2_moe has)")
        return errors
    return check


DEEPSEEK_ROUTING = {"first_k_dense": 0, "n_group": None, "topk_group": None, "routed_scaling_factor": 1.0}


def not_deepseek_routing(family: str):
    """A family check: DeepSeek-V3's routing keys (dense first layers, grouped routing, the weights'
    scale) left as they are (only family deepseek_v3 has them)."""
    def check(mc) -> list[str]:
        set_ = [k for k, v in DEEPSEEK_ROUTING.items() if mc.moe is not None and getattr(mc.moe, k) != v]
        return [f"model.moe.{', model.moe.'.join(set_)}: not keys of family {family} (deepseek_v3 has them)"] if set_ else []
    return check


def mlp_with_experts(block: nn.Module):
    """A transformers decoder layer's MoE MLP (`block.mlp` holding `experts`), None where the layer is dense."""
    return block.mlp if hasattr(block.mlp, "experts") else None


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The MoE layers of a CausalLM of an MoE family, in block order."""
    plan = model.family.experts
    return [moe for moe in (plan.moe_block(b) for b in model.blocks()) if moe is not None]


def experts_of(model: nn.Module) -> list[nn.Module]:
    plan = model.family.experts
    return [getattr(moe, plan.experts_attr) for moe in moe_layers(model)]


def param_counts(model: nn.Module, top_k: int) -> dict:
    """Total parameters and those one token uses (the routed experts' share is top_k / experts)."""
    from ddlbench.models.spec import count_params
    total = count_params(model)
    experts = sum(p.numel() for e in experts_of(model) for p in e.parameters())
    unused = sum(p.numel() * (e.num_experts - top_k) // e.num_experts for e in experts_of(model) for p in e.parameters())
    return {"total": total, "active": total - unused, "experts": experts}


class RouterStats:
    """Tokens routed to each expert of each MoE layer, counted on the device during training
    (scatter_add into a fixed-size tensor: no host sync, no data-dependent shape) by a forward hook
    on every router, or handed in by a framework's own MoE layer (`add_counts`, DeepSpeed-MoE); the
    tokens dropped over capacity where the layer drops; the router's auxiliary loss. Read once
    after the run."""

    def __init__(self, model: nn.Module, hook: bool = True):
        self._counts: list = []
        self._aux_sum, self._aux_n = None, 0      # a running sum on the device: no list that grows per step
        self._dropped = None
        plan = model.family.experts
        for moe in (plan.moe_block(b) for b in model.family.blocks(model.net)):
            if moe is not None:
                router = getattr(moe, plan.router_attr)
                if hook:
                    router.register_forward_hook(functools.partial(self._hook, len(self._counts), router.num_experts))
                self._counts.append(None)

    def _hook(self, layer: int, experts: int, module, args, output) -> None:
        if module.training:
            indices = output[2].reshape(-1)
            with torch.no_grad():
                self._tensor(layer, experts, indices.device).scatter_add_(0, indices, torch.ones_like(indices))

    def _tensor(self, layer: int, experts: int, device) -> torch.Tensor:
        if self._counts[layer] is None:
            self._counts[layer] = torch.zeros(experts, dtype=torch.long, device=device)
        return self._counts[layer]

    def add_counts(self, layer: int, counts: torch.Tensor, dropped: torch.Tensor | None = None) -> None:
        """A layer's tokens per expert in one forward (and the (token, expert) pairs it dropped)."""
        with torch.no_grad():
            self._tensor(layer, counts.numel(), counts.device).add_(counts.reshape(-1).long())
            if dropped is not None:
                self._dropped = dropped.long() if self._dropped is None else self._dropped + dropped.long()

    def add_aux(self, aux: torch.Tensor) -> None:
        aux = aux.detach().float()
        self._aux_sum = aux if self._aux_sum is None else self._aux_sum + aux
        self._aux_n += 1

    def take(self) -> dict:
        """{'tokens_per_expert': [[per expert] per layer], 'aux_loss_mean': float | None,
        'dropped': int | None}: this rank's."""
        counts = [[] if c is None else c.tolist() for c in self._counts]
        aux = (self._aux_sum / self._aux_n).item() if self._aux_n else None
        return {"tokens_per_expert": counts, "aux_loss_mean": aux,
                "dropped": None if self._dropped is None else int(self._dropped.item())}


def find_router_stats(module: nn.Module):
    """The RouterStats of the CausalLM inside a strategy's (wrapped) model, or None."""
    for m in module.modules():
        stats = getattr(m, "router_stats", None)
        if stats is not None:
            return stats
    return None


def load_summary(per_rank: list[dict], ep: int, replicas: int = 1) -> dict:
    """The record's view of every rank's counts: tokens per expert summed over ranks (divided by
    `replicas`, the ranks that route the same tokens: tensor-parallel ranks), and per layer the
    load imbalance max/mean across experts and across the `ep` ranks holding them (contiguous
    blocks of experts)."""
    layers = max((len(r["tokens_per_expert"]) for r in per_rank), default=0)
    totals = []
    for layer in range(layers):
        rows = [r["tokens_per_expert"][layer] for r in per_rank if r["tokens_per_expert"][layer]]
        totals.append([sum(col) // replicas for col in zip(*rows)] if rows else [])
    experts_imb, ranks_imb = [], []
    for t in totals:
        if not t or not sum(t):
            continue
        experts_imb.append(max(t) / (sum(t) / len(t)))
        per = len(t) // ep
        by_rank = [sum(t[i * per:(i + 1) * per]) for i in range(ep)]
        ranks_imb.append(max(by_rank) / (sum(by_rank) / ep))
    aux = [r["aux_loss_mean"] for r in per_rank if r.get("aux_loss_mean") is not None]
    dropped = [r["dropped"] for r in per_rank if r.get("dropped") is not None]
    return {"tokens_per_expert": totals,
            "imbalance_experts_max": max(experts_imb, default=None),
            "imbalance_experts_mean": sum(experts_imb) / len(experts_imb) if experts_imb else None,
            "imbalance_ep_ranks_max": max(ranks_imb, default=None),
            "aux_loss_mean": sum(aux) / len(aux) if aux else None,
            # (token, expert) pairs over capacity, summed over ranks: 0 for dropless routing
            "dropped_tokens": sum(dropped) // replicas if dropped else 0}


# ---- expert parallelism ----------------------------------------------------------------------------

def stage_experts(stage: nn.Module, family) -> list[nn.Module]:
    """The experts modules of a pipeline stage's blocks (models.decoder.pieces: each block piece's `layer`)."""
    plan = family.experts
    layers = [plan.moe_block(piece.layer) for piece in stage.children() if hasattr(piece, "layer")]
    return [getattr(moe, plan.experts_attr) for moe in layers if moe is not None]


def shard_experts(model: nn.Module, group, ep: int, ep_rank: int, experts_list: list | None = None) -> int:
    """Keep this rank's experts (a contiguous block of experts // ep) in every MoE layer (of `model`, or the
    experts modules given) and route through all-to-all over `group` (the ep ranks); returns the experts kept
    per layer. The other ranks' experts are dropped from this one; the layer's router stays whole."""
    kept = 0
    for experts in experts_of(model) if experts_list is None else experts_list:
        total = experts.num_experts
        local = total // ep
        for name, p in list(experts.named_parameters(recurse=False)):
            if p.dim() >= 1 and p.shape[0] == total:
                setattr(experts, name, nn.Parameter(p.detach()[ep_rank * local:(ep_rank + 1) * local].clone()))
        experts.num_experts = local
        experts.forward = functools.partial(dispatch_combine, experts.forward, group, ep, local)
        kept = local
    return kept


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable all_to_all_single (its backward is the reverse all-to-all)."""
    from torch.distributed.nn.functional import all_to_all_single
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    return all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)


def dispatch_combine(local_forward, group, ep: int, local: int, hidden: torch.Tensor,
                     top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """torchtitan's expert-parallel token dispatch around this rank's experts:
    1. sort the (token, expert) pairs by expert: destination ranks are then contiguous;
    2. exchange the counts per expert (all-to-all, then one host read of the split sizes);
    3. all-to-all the tokens to the ranks holding their experts;
    4. run the local experts (the run's experts implementation) on what arrived, each token for the
       one expert it came for (weight 1);
    5. all-to-all the outputs back, weight them by the router and sum each token's top-k outputs."""
    import torch.distributed as dist
    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.zeros(ep * local, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    send = counts.view(ep, local).sum(1).tolist()
    recv_counts = received.view(ep, local)
    recv = recv_counts.sum(1).tolist()
    routed = all_to_all(hidden[token], recv, send, group)
    expert = torch.arange(local, device=flat.device).repeat(ep).repeat_interleave(recv_counts.reshape(-1))
    out = local_forward(routed, expert.unsqueeze(1), torch.ones(len(expert), 1, dtype=routed.dtype, device=routed.device))
    back = all_to_all(out, send, recv, group)
    weights = top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)
    return torch.zeros_like(hidden).index_add_(0, token, back * weights)


def all_to_all_payload(layers: int, tokens: int, top_k: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes one rank hands to all-to-all per step with uniform routing: per MoE layer its tokens'
    top_k copies to their experts and the outputs back (forward), the gradients of both (backward):
    4 x tokens x top_k x hidden x bytes. (Uneven routing changes the combine's and the dispatch
    gradient's share: what the rank received.)"""
    return 4 * layers * tokens * top_k * hidden * dtype_bytes


def all_to_all_bytes_per_layer(tokens: int, top_k: int, hidden: int, ep: int, dtype_bytes: int) -> float:
    """Analytic bytes one rank sends per MoE layer per forward with uniform routing: each of its
    tokens' top_k copies leaves the rank with probability (ep-1)/ep, there and back (dispatch and
    combine); backward sends the same again. The counts' all-to-all (ep x experts/ep int64) is
    left out."""
    return 2 * 2 * tokens * top_k * hidden * dtype_bytes * (ep - 1) / ep


def dry_run_layout(model_cfg, ep: int, dims) -> dict:
    """What `run.dry_run=true` says about an MoE model split over `ep` ranks on `dims` (no process
    group, the model on the meta device): parameters per rank (experts: a 1/ep share, FSDP2-sharded
    over dp_shard/ep; the dense part FSDP2-sharded over dp_shard and, for its attention, over tp),
    their model state in bytes (fp32 parameters and gradients, AdamW's two fp32 moments: 16 bytes a
    parameter), and per MoE layer per micro-batch the tokens one rank dispatches and the all-to-all
    bytes it sends (uniform routing, activations in the run's dtype)."""
    from ddlbench import models
    from ddlbench.models.tensor_parallel import split_param_count
    spec = models.build(model_cfg)
    with torch.device("meta"):
        model = spec.build()
    counts = param_counts(model, model_cfg.moe.top_k)
    dense = counts["total"] - counts["experts"]
    split = split_param_count(model) if dims.tp > 1 else 0
    dense_rank = (dense - split + split / dims.tp) / dims.dp_shard
    experts_rank = counts["experts"] / ep / (dims.dp_shard // ep)
    per_rank = dense_rank + experts_rank
    tokens = dims.micro_batch * model_cfg.seq_len
    layers = len(moe_layers(model))
    sent = all_to_all_bytes_per_layer(tokens, model_cfg.moe.top_k, model_cfg.n_embd, ep, 2)
    return {"params_total": counts["total"], "params_active": counts["active"], "params_experts": counts["experts"],
            "moe_layers": layers, "experts_per_rank": model_cfg.moe.num_experts // ep,
            "params_per_rank": round(per_rank), "params_per_rank_experts": round(experts_rank),
            "params_per_rank_dense": round(dense_rank),
            "model_state_bytes_per_rank": round(16 * per_rank),
            "model_state_note": "fp32 parameters + gradients + AdamW's two moments (16 B/parameter), FSDP2-sharded; "
                                "activations not included",
            "tokens_dispatched_per_layer": tokens * model_cfg.moe.top_k,
            "all_to_all_bytes_per_layer_per_microbatch_bf16": round(sent),
            "all_to_all_bytes_per_step_bf16": round(sent * layers * dims.grad_accum)}
