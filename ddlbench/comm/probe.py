"""Count collectives where they are issued: a TorchDispatchMode that sees every `c10d` and
`_c10d_functional` op (DDP's reducer, FSDP2, DTensor, DeepSpeed and plain `dist.*` calls all go
through them), with their payload sizes.

Python dispatch modes cost time on every op, so the runner uses this only on one extra,
untimed step after the measured window, never inside it.
"""
from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from ddlbench.metrics.comm import CommCounter

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


def written_bytes() -> int:
    """Bytes this process has written to file descriptors (all threads): /proc/self/io `wchar`.
    Gloo sends through writev on TCP sockets, so around a step with no other output this is
    what gloo put on the wire (an independent check of the counted collective volume)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


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
    reduce-scatter input, all-reduce buffer); all-to-all: the input (with uneven splits the output
    differs). Functional all-gather receives only the shard."""
    if name.startswith("all_gather_into_tensor"):
        return _arg_bytes(args[0]) * int(args[1])
    if name.startswith("alltoall_base"):
        return _arg_bytes(args[1])
    if name.startswith("all_to_all_single"):
        return _arg_bytes(args[0])
    return max((_arg_bytes(a) for a in args), default=0)


def all_to_all_sent(name: str, args) -> int | None:
    """Bytes an all-to-all sends to the other ranks: its input less the split it keeps (uneven
    splits: expert parallelism's token counts); None where the op's layout is not known."""
    import torch.distributed as dist
    try:
        if name.startswith("alltoall_base"):
            data, pg, splits = args[1], dist.ProcessGroup.unbox(args[2]), list(args[4])
            n, me = pg.size(), pg.rank()
        elif name.startswith("all_to_all_single"):     # functional: (input, output splits, input splits, group name)
            from torch.distributed.distributed_c10d import _resolve_process_group
            data, splits, pg = args[0], list(args[2] or []), _resolve_process_group(args[3])
            n, me = pg.size(), pg.rank()               # (torch's ring attention passes its buffer on whole)
        else:
            return None
        total = data.numel() * data.element_size()
        rows = data.shape[0] if data.dim() else 0
        if not splits:
            return total * (n - 1) // n
        return total - (total // rows * int(splits[me]) if rows else 0)
    except Exception:   # noqa: BLE001 - a layout this torch does not have: the ring factor then
        return None


def group_key(name: str, args, node: list[int]):
    """'<ranks>@<nodes>' of the process group a c10d op runs in: its size and how many nodes
    (node[r]: rank r's node, ddlbench/comm/topology.py) it spans. None if it cannot be told."""
    import torch.distributed as dist
    try:
        pg = None
        for a in args:
            if isinstance(a, torch.ScriptObject):
                pg = dist.ProcessGroup.unbox(a)
                break
            if isinstance(a, dist.ProcessGroup):
                pg = a
                break
        if pg is None and name in FUNCTIONAL_GROUP_ARG and len(args) > FUNCTIONAL_GROUP_ARG[name]:
            from torch.distributed.distributed_c10d import _resolve_process_group
            pg = _resolve_process_group(args[FUNCTIONAL_GROUP_ARG[name]])
        if pg is None:
            return None
        ranks = dist.get_process_group_ranks(pg)
        return f"{len(ranks)}@{len({node[r] for r in ranks})}"
    except Exception:   # an op layout this torch does not have: counted without a group
        return None


# _c10d_functional ops name their group by string, at this argument position
FUNCTIONAL_GROUP_ARG = {"all_reduce": 2, "all_reduce_": 2, "all_reduce_coalesced": 2,
                        "all_gather_into_tensor": 2, "all_gather_into_tensor_out": 2,
                        "all_gather_into_tensor_coalesced": 2, "reduce_scatter_tensor": 3,
                        "reduce_scatter_tensor_coalesced": 3, "all_to_all_single": 3, "broadcast": 2,
                        "broadcast_": 2}


def _deepspeed_op(name: str, args):
    """DeepSpeed-Ulysses's all-to-all is a custom op (deepspeed::dim_zero_all_to_all(input,
    group_name)) whose all_to_all_single runs where a dispatch mode does not see it: counted as
    that all_to_all_single over its group."""
    if name != "dim_zero_all_to_all":
        return None
    from deepspeed.sequence.layer import _all_to_all_groups
    return "all_to_all_single", [args[0], args[0], _all_to_all_groups[args[1]]]


OPAQUE = {"deepspeed": _deepspeed_op}   # namespace -> (op name, args) -> (the collective's name, its args) | None


# torch.distributed functions a framework may call from a future's callback, on the backend's
# worker thread, where the (thread-local) dispatch mode does not see them: PowerSGD all-reduces
# its Q matrices in `.then(compute_qs)`. Found by comparing counts with the bytes gloo wrote.
PATCHED = {"all_reduce": "all_reduce", "all_gather_into_tensor": "_allgather_base",
           "reduce_scatter_tensor": "_reduce_scatter_base", "broadcast": "broadcast", "reduce": "reduce_",
           "all_to_all_single": "all_to_all_single"}


class CollectiveCounter(TorchDispatchMode):
    """Counts every c10d op dispatched on the thread that enters it, and the torch.distributed
    calls made on any other thread meanwhile (future callbacks)."""

    def __init__(self, node: list[int]) -> None:
        super().__init__()
        self.counter = CommCounter()
        self.node = node          # rank -> its node
        self._lock = threading.Lock()
        self._saved: dict = {}

    def _add(self, name: str, args) -> None:
        kind = op_kind(name)
        if kind and not name.startswith(SKIP):
            sent = all_to_all_sent(name, args) if kind == "all_to_all" else None
            with self._lock:
                self.counter.add(kind, payload_bytes(name, args), group=group_key(name, args, self.node), sent=sent)

    def _wrap(self, fn, op_name: str):
        import torch.distributed as dist
        owner = threading.get_ident()

        def counted(*args, **kwargs):
            if threading.get_ident() != owner:
                group = kwargs.get("group") or dist.group.WORLD
                self._add(op_name, list(args) + [group])
            return fn(*args, **kwargs)
        return counted

    def __enter__(self):
        import torch.distributed as dist
        for fn_name, op_name in PATCHED.items():
            self._saved[fn_name] = getattr(dist, fn_name)
            setattr(dist, fn_name, self._wrap(self._saved[fn_name], op_name))
        return super().__enter__()

    def __exit__(self, *exc):
        import torch.distributed as dist
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass(a) for a in tree_flatten((args, kwargs))[0]):
            # left to the subclass (DTensor), whose ops on its local tensors come back here: the collectives
            # its op handlers issue (loss parallel's cross-entropy sums, ring attention's passes) are counted
            return NotImplemented
        if func.namespace in NAMESPACES:
            self._add(func._schema.name.split("::")[-1], args)
        elif func.namespace in OPAQUE:        # a library's custom op around a collective: the mode
            seen = OPAQUE[func.namespace](func._schema.name.split("::")[-1], args)   # cannot see inside it
            if seen:
                self._add(*seen)
        return func(*args, **(kwargs or {}))

    def take(self) -> dict:
        return self.counter.take()
