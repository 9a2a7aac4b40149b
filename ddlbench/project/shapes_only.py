"""A traced step that is never timed, of a model built on meta and given empty storage (FSDP2's),
needs its collectives' sizes, not its values (garbage already: a fake group sends nothing back). Under ShapesOnly the matrix products of plain tensors
return storage of the right shape, stride and dtype, uncomputed: on a CPU without native bf16 GEMMs
(torch's reference kernel) re-planning the H200 llama_1b record traced 8 positions in ~210 s a world
size, nearly all of it in those products."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

aten = torch.ops.aten
PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _plain(args) -> list[torch.Tensor]:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    plain = (torch.Tensor, torch.nn.Parameter)      # not a subclass with its own dispatch (DTensor)
    return tensors if all(type(t) in plain and t.device.type != "meta" for t in tensors) else []


class ShapesOnly(TorchDispatchMode):
    """Inside: aten mm/addmm/bmm/baddbmm of plain tensors give an uninitialised result whose shape,
    stride and dtype are the op's own (worked out on meta); `skipped` counts them. Everything else
    (a tensor subclass's product too) runs as it would."""

    def __init__(self):
        super().__init__()
        self.skipped = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _plain(args) if func in PRODUCTS and "out" not in kwargs else []
        if not tensors:
            return func(*args, **kwargs)
        meta = func(*tree_map_only(torch.Tensor, lambda t: t.to("meta"), args), **kwargs)
        self.skipped += 1
        return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=tensors[0].device)
