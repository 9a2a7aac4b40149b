"""torch's ring attention (context parallelism's SDPA path, torch.distributed.tensor.experimental
.context_parallel) for the CPU's SDPA kernel, so that context parallelism runs for real on a CPU over
gloo as it runs on a GPU over NCCL.

torch 2.14 dispatches SDPA under `context_parallel` to its ring only for the CUDA kernels (flash,
memory-efficient, cuDNN); on a CPU the op is `_scaled_dot_product_flash_attention_for_cpu`, which has
no sharding rule ("does not have a sharding strategy registered"). Its outputs and arguments are the
CUDA flash kernel's in the same layout (output [B, H, T, D], logsumexp [B, H, T]), so torch's own
`_templated_ring_attention` / `_templated_ring_attention_backward` run it unchanged: each rank keeps its
queries, the keys and values go round the ring, the partial outputs are merged by their logsumexp,
and causal masking with torch's head-tail load balancer skips or halves the blocks it can. `enable()`
adds the CPU op (and its backward) to the handlers and sharding rules torch installs when the
context-parallel dispatcher is on; nothing else of torch changes, and on a GPU it is never called.

This reaches into torch's private context-parallel module (its handler table and rule list):
`enable()` checks for what it uses and raises a clear error where a torch release moved them.
"""
from __future__ import annotations

from functools import cache

SEQ_DIM = 2          # [batch, heads, sequence, head_dim], as torch's ring assumes


@cache
def enable() -> None:
    """Register the CPU flash kernel's ring handlers and sharding rules (idempotent)."""
    import torch
    from torch.distributed.tensor import DTensor
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
        from torch.distributed.tensor.experimental._context_parallel import _sharding_rules as rules
        needed = (cp.custom_ops, cp._templated_ring_attention, cp._templated_ring_attention_backward,
                  rules._single_dim_strategy_context, rules._cp_sharding, rules.register_cp_sharding_rules)
    except (ImportError, AttributeError) as exc:        # another torch: say so rather than run wrong
        raise RuntimeError(f"context parallelism on CPU needs torch 2.14's context-parallel internals: {exc}") from None
    del needed
    aten = torch.ops.aten
    forward, backward = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                         aten._scaled_dot_product_flash_attention_for_cpu_backward.default)

    def ring_forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        if attn_mask is not None:
            raise NotImplementedError("ring attention takes is_causal, not a mask (model.attention=sdpa_causal)")
        return cp._templated_ring_attention(mesh.get_group(), SEQ_DIM, forward, query=query, key=key, value=value,
                                            is_causal=is_causal, dropout_p=dropout_p, scale=scale)

    def ring_backward(mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                      scale=None):
        return cp._templated_ring_attention_backward(
            mesh.get_group(), SEQ_DIM, backward, grad_out=grad_out, grad_out_name="grad_out", query=query, key=key,
            value=value, out=out, logsumexp=logsumexp, is_causal=is_causal, dropout_p=dropout_p, scale=scale)

    calls = {forward: ring_forward, backward: ring_backward}

    def handler(op_call, args, kwargs):
        """torch's _sdpa_handler, for the CPU kernel: unwrap, check the placements, ring, wrap."""
        info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        DTensor._op_dispatcher.sharding_propagator.propagate(info)
        sharding = info.output_sharding
        if sharding is None or sharding.needs_redistribute:
            raise AssertionError("ring attention: q, k and v must be sharded on the sequence alike")
        out = calls[op_call](info.compute_mesh, *info.local_args, **info.local_kwargs)
        return DTensor._op_dispatcher.wrap(out, sharding.output_spec)

    def forward_rule(op, args_schema, kwargs_schema):
        return [[rules._cp_sharding(), rules._cp_sharding(),                       # output, logsumexp
                 rules._cp_sharding(), rules._cp_sharding(), rules._cp_sharding()]]  # q, k, v

    def backward_rule(op, args_schema, kwargs_schema):
        return [[rules._cp_sharding()] * 3                                         # grad q, k, v
                + [rules._cp_sharding()] * 6]                                      # grad_out, q, k, v, out, lse

    cp.custom_ops.update({forward: handler, backward: handler})
    register = rules.register_cp_sharding_rules

    def register_with_cpu():
        register()
        for op, rule in ((forward, forward_rule), (backward, backward_rule)):
            if op not in rules._cp_strategy_contexts:
                ctx = rules._single_dim_strategy_context(op, rule, None)
                rules._original_strategies[op] = ctx.__enter__()
                rules._cp_strategy_contexts[op] = ctx
    rules.register_cp_sharding_rules = register_with_cpu
