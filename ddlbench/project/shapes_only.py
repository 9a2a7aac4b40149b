"""A traced step that is never timed, of a model built on meta and given empty storage (FSDP2's),
needs its collectives' sizes, not its values (garbage already: a fake group sends nothing back).
Under ShapesOnly the aten ops of plain tensors whose results are large (and every matrix product)
return storage of the right shape, stride and dtype, uncomputed; an in-place op or one writing `out=`
leaves what it writes as it was. On a CPU without native bf16 GEMMs re-planning the H200 llama_1b
record traced 8 positions in ~210 s a world size, nearly all of it in the products. With the products
alone skipped, the rest (FSDP's copies into and out of its flat buffers, casts: ~45 GB of memory
touched) kept one world size's trace at 25 s in process; with them skipped 14 s, and the whole command
(`bench project RUN world_sizes=[1,8,1024]`) 29.6 -> 19.7 s, 5.1 -> 1.6 GB resident (2-core VM).

What runs as it would: views (they alias, cost nothing), small results (a loss, a norm, a flag a
framework reads back), ops whose result's size depends on values (nonzero: meta cannot say). A
tensor subclass's op (DTensor's) is left to the subclass, whose ops on its local tensors come back
here (the optimizer's update of FSDP2's sharded parameters among them). Ops outside aten
(collectives: c10d's, counted by ddlbench/comm/probe.py), anything on meta already."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map_only

aten = torch.ops.aten
PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
# below this many bytes of result an op computes: reading a small value back must see it computed
SMALL_BYTES = 1 << 16
# aten's ops, and FSDP2's copies into and out of its flat buffers (chunk_cat, split_with_sizes_copy,
# all_gather_copy_in: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, meta kernels of their own)
NAMESPACES = {"aten", "fsdp"}
# metadata changes: cheap, and the tensor they change must really change
KEEP = {"set_", "resize_", "resize_as_", "as_strided_", "_local_scalar_dense", "detach_", "requires_grad_"}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _plain(tensors: list[torch.Tensor]) -> bool:
    """Every tensor plain (not a subclass with its own dispatch, as DTensor) and off meta."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta" for t in tensors)


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(tree))


def _argument(schema, args, kwargs, name: str):
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else kwargs.get(name, a.default_value)
    raise KeyError(name)


class ShapesOnly(TorchDispatchMode):
    """Inside: the ops the module docstring names give an uninitialised result of the op's own shape,
    stride and dtype (worked out on meta), an in-place op its own (unchanged) operand; `skipped`
    counts them. Everything else runs as it would."""

    def __init__(self):
        super().__init__()
        self.skipped = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass(t) for t in _tensors((args, kwargs))):
            return NotImplemented      # the subclass (DTensor) dispatches: its local ops come back here
        out = self._uncomputed(func, args, kwargs)
        return func(*args, **kwargs) if out is NotImplemented else out

    def _uncomputed(self, func, args, kwargs):
        schema = func._schema
        if func.namespace not in NAMESPACES or func.is_view or schema.name.split("::")[-1] in KEEP:
            return NotImplemented
        tensors = _tensors((args, kwargs))
        if not _plain(tensors):
            return NotImplemented
        product = func in PRODUCTS and "out" not in kwargs
        if not product and (not tensors or max(t.numel() * t.element_size() for t in tensors) < SMALL_BYTES):
            return NotImplemented      # nothing large in: nothing large out (a factory of its own computes)
        try:
            meta = func(*tree_map_only(torch.Tensor, lambda t: t.to("meta"), args),
                        **tree_map_only(torch.Tensor, lambda t: t.to("meta"), kwargs))
        except Exception:      # noqa: BLE001 - meta cannot say (a value-dependent size): computed
            return NotImplemented
        written = schema.is_mutable
        if not product and not written and _nbytes(meta) < SMALL_BYTES:
            return NotImplemented      # a small result may be read back (a loss, a norm, a flag)
        self.skipped += 1
        device = tensors[0].device
        fresh = tree_map_only(torch.Tensor, lambda m: torch.empty_strided(m.shape, m.stride(), dtype=m.dtype,
                                                                          device=device), meta)
        if not written:
            return fresh
        # an in-place or out= op returns what it wrote: the operand itself, left as it was
        outs = []
        for i, ret in enumerate(schema.returns):
            alias = ret.alias_info
            source = next((a.name for a in schema.arguments if a.alias_info is not None and alias is not None
                           and a.alias_info.before_set == alias.before_set), None)
            outs.append(_argument(schema, args, kwargs, source) if source else
                        (fresh[i] if isinstance(fresh, (tuple, list)) else fresh))
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)
