"""Count collectives where they are issued: a TorchDispatchMode that sees every `c10d` and
`_c10d_functional` op (DDP's reducer, FSDP2, DTensor, DeepSpeed and plain `dist.*` calls all go
through them), with their payload sizes.

Python dispatch modes cost time on every op, so the runner uses this only on one extra,
untimed step after the measured window, never inside it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.metrics.comm import CommCounter

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
KINDS = (  # op-name prefix -> collective kind (order matters: longer names first)
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("_allgather", "all_gather"), ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("_reduce_scatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("broadcast", "broadcast"), ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("send", "send"), ("recv", "recv"), ("reduce_", "reduce"), ("gather", "gather"),
    ("scatter", "scatter"), ("barrier", "barrier"),
)
SKIP = ("wait_tensor", "monitored_barrier")


def _arg_bytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_arg_bytes(a) for a in arg)
    return 0


def op_kind(name: str) -> str | None:
    for prefix, kind in KINDS:
        if name.startswith(prefix):
            return kind
    return None


def payload_bytes(name: str, args) -> int:
    """The full-size buffer of the collective: the largest tensor argument (all-gather output,
    reduce-scatter input, all-reduce buffer). Functional all-gather receives only the shard."""
    if name.startswith("all_gather_into_tensor"):
        return _arg_bytes(args[0]) * int(args[1])
    return max((_arg_bytes(a) for a in args), default=0)


def group_key(name: str, args, ranks_per_node: int):
    """'<ranks>@<nodes>' of the process group a c10d op runs in: its size and how many nodes
    (blocks of `ranks_per_node` consecutive ranks) it spans. None if it cannot be told."""
    import torch.distributed as dist
    try:
        pg = None
        for a in args:
            if isinstance(a, torch.ScriptObject):
                pg = dist.ProcessGroup.unbox(a)
                break
        if pg is None and name in FUNCTIONAL_GROUP_ARG and len(args) > FUNCTIONAL_GROUP_ARG[name]:
            from torch.distributed.distributed_c10d import _resolve_process_group
            pg = _resolve_process_group(args[FUNCTIONAL_GROUP_ARG[name]])
        if pg is None:
            return None
        ranks = dist.get_process_group_ranks(pg)
        return f"{len(ranks)}@{len({r // ranks_per_node for r in ranks})}"
    except Exception:   # an op layout this torch does not have: counted without a group
        return None


# _c10d_functional ops name their group by string, at this argument position
FUNCTIONAL_GROUP_ARG = {"all_reduce": 2, "all_reduce_": 2, "all_reduce_coalesced": 2,
                        "all_gather_into_tensor": 2, "all_gather_into_tensor_out": 2,
                        "all_gather_into_tensor_coalesced": 2, "reduce_scatter_tensor": 3,
                        "reduce_scatter_tensor_coalesced": 3, "all_to_all_single": 3, "broadcast": 2,
                        "broadcast_": 2}


class CollectiveCounter(TorchDispatchMode):
    def __init__(self, ranks_per_node: int = 1 << 30) -> None:
        super().__init__()
        self.counter = CommCounter()
        self.ranks_per_node = ranks_per_node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in NAMESPACES:
            name = func._schema.name.split("::")[-1]
            kind = op_kind(name)
            if kind and not name.startswith(SKIP):
                self.counter.add(kind, payload_bytes(name, args), group=group_key(name, args, self.ranks_per_node))
        return func(*args, **(kwargs or {}))

    def take(self) -> dict:
        return self.counter.take()
