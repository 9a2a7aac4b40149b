"""An independent measure of a run's memory: torch's own MemTracker
(torch.distributed._tools.mem_tracker) around the whole run on every rank, `run.memory_tracker=true`.

It counts the bytes of every tensor storage alive on the rank's device, from before the adapter
builds its model (so DDP's buckets, DeepSpeed's flat partitions and FSDP's shards are seen), through
the framework's own code: what `bench advise`'s estimator (ddlbench/estimate/memory.py) predicts from
cost models and a meta-device profile is checked against what the framework really allocated
(benchmarks/memory_check.py, tests/test_memory_check.py). On CPU it is the only per-tensor measure
there is (the run records host RSS otherwise); on CUDA the allocator's peak is recorded as well.

What it cannot see: memory that a library allocates outside torch's dispatcher (Horovod's fusion
buffer, gloo's and NCCL's internal buffers, DeepSpeed's C++ optimizer kernels' scratch) and
tensors made on another thread. Every op goes through a Python dispatch mode, so steps under it
are slow: the run's step times say nothing then (the record warns).

The peak is the largest live total of the steps after the first one (the first step creates the
optimizer's state lazily; from the second on the run is in its steady state).

On a CPU, `run.device_memory_gb` is enforced here (a GPU caps its allocator, ddlbench/machine/device.py):
an op that takes the live tensors above it raises torch.OutOfMemoryError, and the run ends `oom`
as on a GPU of that size. The cap turns the tracker on.
"""
from __future__ import annotations

import torch

SOURCE = f"torch.distributed._tools.mem_tracker.MemTracker (torch {torch.__version__.split('+')[0]})"
KINDS = {"Parameter": "params", "Buffer": "buffers", "Gradient": "grads", "Optstate": "optimizer",
         "Other": "other", "Activation": "rest", "Temp": "rest"}
# grads: only those that existed when `label` ran; rest: other gradients, activations, temporaries and
# the framework's own buffers; optimizer: its state and its step's temporaries


def _tracker_class():
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils._python_dispatch import TorchDispatchMode

    class StorageTracker(MemTracker):
        """MemTracker's per-storage accounting without its module hooks (ModTracker): those refuse a
        root module's second forward, and their multi-grad hooks break torch.distributed.pipelining's
        stage backward (autograd.grad). Without them MemTracker cannot tell activations from
        temporaries or gradients (all are 'Activation', except what the optimizer allocates and
        what `label` names): the peak, which is what this tracker reports, does not depend on it.
        __enter__/__exit__ are MemTracker's (torch 2.14.1) less the module-hook lines."""

        def __enter__(self):
            if self._depth == 0:
                self._fake_mode_on_entry = None
                self._register_global_optimizer_hook()
                self._track_resize()
                self._peak_mem_snap = self.get_tracker_snapshot()
                self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
            TorchDispatchMode.__enter__(self)
            self._depth += 1
            return self

        def __exit__(self, *args):
            self._depth -= 1
            if self._depth == 0:
                self._deregister_param_and_optimizer_hooks()
                self._restore_resize()
            TorchDispatchMode.__exit__(self, *args)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            cap = getattr(self, "cap_bytes", None)
            if cap is not None and out is not NotImplemented:
                for dev, snap in self._curr_mem_snap.items():
                    if torch.device(dev).type == "cpu" and snap.get("Total", 0) > cap:
                        raise torch.OutOfMemoryError(
                            f"CPU out of memory on the emulated device: {snap['Total'] / 2**30:.3f} GiB of tensors "
                            f"live, above run.device_memory_gb = {cap / 2**30:.3f} GiB (counted by the tracker)")
            return out

    return StorageTracker


class RunTracker:
    """with RunTracker(device) as t: ...; t.reset_peak() at the start of the steady state;
    t.result() after the loop."""

    def __init__(self, device: torch.device, cap_bytes: int | None = None):
        """cap_bytes (CPU): an allocation that takes the live tensors above it raises
        torch.OutOfMemoryError, as a GPU of that size would (run.device_memory_gb on a CPU)."""
        self.device = device
        self.tracker = _tracker_class()()
        self.tracker.cap_bytes = cap_bytes if device.type == "cpu" else None

    def __enter__(self) -> "RunTracker":
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.__exit__(*exc)

    def label(self, *objects) -> None:
        """Name what the adapter built (modules' parameters and buffers, the optimizer's state)."""
        self.tracker.track_external(*[o for o in objects if isinstance(o, (torch.nn.Module, torch.optim.Optimizer))])

    def reset_peak(self) -> None:
        """Forget the peak so far: from here on the peak is the largest live total reached."""
        t = self.tracker
        now = t.get_tracker_snapshot("current")
        t._peak_mem = {dev: snap["Total"] for dev, snap in now.items()}
        t._peak_mem_snap = now

    def result(self) -> dict:
        """{'peak_bytes', 'by_kind': {params, buffers, grads, optimizer, other, rest} at that peak,
        'current_bytes', 'source', 'device'} on the rank's device."""
        def on_device(kind: str) -> dict:
            for dev, snap in self.tracker.get_tracker_snapshot(kind).items():
                if torch.device(dev).type == self.device.type:
                    return {str(k.value if hasattr(k, "value") else k): int(v) for k, v in snap.items()}
            return {}
        peak, now = on_device("peak"), on_device("current")
        kinds: dict[str, int] = {}
        for k, v in peak.items():
            if k in KINDS:
                kinds[KINDS[k]] = kinds.get(KINDS[k], 0) + v
        return {"peak_bytes": peak.get("Total", 0), "by_kind": kinds,
                "current_bytes": now.get("Total", 0), "source": SOURCE, "device": self.device.type}
