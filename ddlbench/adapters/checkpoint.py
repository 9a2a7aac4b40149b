"""Saving a rank's training state the framework's recommended way (run.checkpoint; the runner's
ddlbench/rank/saves.py decides when, and reads every clock: adapters read none). A saver's
`save(path, mode)` returns a Save: for an async save the future that completes once the write is
durable (its callback counts the rank's bytes then), and `load(path)` yields the name of each phase
as it ends, for the caller to time.

- DcpSaver: torch.distributed.checkpoint (DCP) of `get_state_dict(model, optimizer)`, sync
  (`dcp.save`) or async (`dcp.async_save`: the state staged, the write in a thread), over a gloo
  group of the saves' own so a save's collectives never interleave with training's. What torchtitan
  does for FSDP2, TP, PP and their compositions; DDP's state too (one replica's keys, deduplicated).
- Rank0Saver: rank 0's `torch.save` of the model's and optimizer's state dicts (Horovod's examples;
  FairScale's, gathered to rank 0 first, as its docs save them).
- EngineSaver: DeepSpeed's own `engine.save_checkpoint` / `load_checkpoint` (its strategy picks it).
Each also loads what it saved (`load(path)`, run.checkpoint.resume_from), timed by phase.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# the run.checkpoint modes a DCP-saving strategy offers (Abilities.checkpoints): async writes in a thread
# of the rank, async_process in a background process of DCP's (its own process group; the rank only stages)
# async_pinned (CUDA only; torchtitan's async_with_pinned_mem): the thread's write, its staging copy into
# pinned host buffers kept from save to save, issued without blocking (DCP's DefaultStager)
DCP = ("sync", "async", "async_process", "async_pinned")
NEEDS_CUDA = {"async_pinned": "pinned host memory is for copies from a GPU"}


@dataclass
class Save:
    """One save on this rank; its times (perf_counter) are set by the caller (ddlbench/rank/saves.py)."""
    path: str
    began: float = 0.0
    blocked_s: float = 0.0
    future: Any = None                 # an async save's concurrent.futures.Future; None: durable on return
    done: Optional[float] = None       # when the write was durable (set on return, or by the future's callback)
    nbytes: Optional[int] = None       # this rank's bytes of it, counted once durable
    error: Optional[str] = None
    extra: dict = field(default_factory=dict)

    def durable(self) -> bool:
        """No longer in flight: written, or failed (its error kept)."""
        return self.done is not None or self.error is not None


def tensor_bytes(state) -> int:
    """Bytes of the tensors in a (nested) state dict as this rank holds them (a DTensor: its local shard)."""
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    local = getattr(state, "_local_tensor", state)
    return local.numel() * local.element_size() if hasattr(local, "element_size") else 0


def fsync_dir(path: Path) -> None:
    """A checkpoint's files named in their directory on disk (DCP fsyncs its files, not the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_files(path: Path) -> None:
    """A DCP save whole before anything is read: its .metadata (written last, by the coordinator) and
    every file it names, each at least as long as the bytes it holds there. Raises naming the file."""
    from torch.distributed.checkpoint import FileSystemReader
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path / '.metadata'} is missing: not a finished DCP save (its coordinator writes "
                                "it last; a save cut short leaves none)")
    need: dict[str, int] = {}
    for info in FileSystemReader(str(path)).read_metadata().storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        f = path / name
        if not f.is_file():
            raise FileNotFoundError(f"{f} is missing (the checkpoint's metadata names it)")
        if f.stat().st_size < size:
            raise ValueError(f"{f} is torn: {f.stat().st_size} bytes, its metadata needs {size}")


class DcpSaver:
    method = ("torch.distributed.checkpoint: get_state_dict(model, optimizer, flattened) saved by dcp.save (sync) or "
              "dcp.async_save (async: staged, then written in a thread; async_process: in DCP's background process), "
              "FileSystemWriter, a gloo group of its own")

    def __init__(self, model, optimizer, group):
        self.model, self.optimizer, self.group = model, optimizer, group
        self.stager = None       # async_pinned: one stager, its pinned buffers reused by every save

    def _stager(self):
        if self.stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                       use_async_staging=True, use_non_blocking_copy=True))
        return self.stager

    def close(self) -> None:
        """After the last save is durable: the pinned buffers freed."""
        if self.stager is not None:
            self.stager.close()
            self.stager = None

    def state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        # the optimizer's param groups flattened per parameter (torchtitan's choice): ranks holding
        # different parameters (pipeline stages) keep each their own, never one rank's for all
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(flatten_optimizer_state_dict=True))
        return {"model": model_sd, "optimizer": optim_sd}

    def save(self, path: Path, mode: str) -> Save:
        import torch.distributed.checkpoint as dcp
        state = self.state()
        rank = self.group.rank()
        if mode == "sync":
            dcp.save(state, checkpoint_id=str(path), process_group=self.group)
            return Save(str(path), nbytes=self.rank_bytes(path, rank))
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        kind = AsyncCheckpointerType.PROCESS if mode == "async_process" else AsyncCheckpointerType.THREAD
        stager = self._stager() if mode == "async_pinned" else None
        future = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group, async_checkpointer_type=kind,
                                async_stager=stager)
        save = Save(str(path), future=future)
        if stager is not None:      # the stager holds a pinned copy of this rank's every tensor
            save.extra["pinned_bytes"] = tensor_bytes(state)

        def finished(f) -> None:      # in the writer's thread, the moment the save is durable
            exc = f.exception()
            save.error = None if exc is None else f"{type(exc).__name__}: {str(exc)[:600]}"
            save.nbytes = self.rank_bytes(path, rank) if exc is None else None
        future.add_done_callback(finished)
        return save

    def load(self, path: Path):
        """The state read into this rank's layout (DCP reshards: any world size or sharding that holds
        the same parameters), then applied; yields each phase's name as it ends."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        check_files(Path(path))
        state = self.state()        # the target: this rank's shards, which DCP fills in place
        yield "target_s"
        dcp.load(state, checkpoint_id=str(path), process_group=self.group)
        yield "read_s"
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(flatten_optimizer_state_dict=True))
        yield "apply_s"

    @staticmethod
    def rank_bytes(path: Path, rank: int) -> int:
        """This rank's share of a DCP checkpoint: its `__<rank>_<n>.distcp` files (the group's rank:
        DCP names files by the rank in the group it saves over)."""
        return sum(p.stat().st_size for p in Path(path).glob(f"__{rank}_*.distcp"))


class EngineSaver:
    method = "DeepSpeed's engine.save_checkpoint(dir, tag): its own layout (model states, each rank's ZeRO partition)"

    def __init__(self, engine, rank: int):
        self.engine, self.rank = engine, rank

    def save(self, path: Path, mode: str) -> Save:
        self.engine.save_checkpoint(str(Path(path).parent), tag=Path(path).name)
        # this rank's files: its ZeRO partition (zero_pp_rank_<r>_...), and rank 0's model states
        mine = [p for p in Path(path).glob("*") if f"zero_pp_rank_{self.rank}_" in p.name
                or (self.rank == 0 and "zero_pp_rank_" not in p.name and p.is_file())]
        return Save(str(path), nbytes=sum(p.stat().st_size for p in mine))

    def load(self, path: Path):
        """DeepSpeed's engine.load_checkpoint(dir, tag): its files read, each rank's partition applied. A
        universal checkpoint (`python -m deepspeed.checkpoint.ds_to_universal`: a `zero/` folder of
        per-parameter fp32 states) is loaded as one, into any data-parallel size and ZeRO stage
        (the engine's `checkpoint.load_universal`, read when it loads, set here for that load)."""
        if (Path(path) / "zero").is_dir() and not any(Path(path).glob("*optim_states.pt")):
            self.engine._config.load_universal_checkpoint = True
        loaded, _ = self.engine.load_checkpoint(str(Path(path).parent), tag=Path(path).name)
        if loaded is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint under tag {Path(path).name} in {Path(path).parent}")
        yield "read_s"


class Rank0Saver:
    """Rank 0's torch.save, fsynced, of the state `gather()` returns; every rank calls it first (a
    collective where the state must be gathered: FairScale's OSS consolidate_state_dict, its FSDP's
    full state dicts; Horovod's replicas need none)."""

    def __init__(self, gather, rank: int, method: str, apply=None):
        self.gather, self.rank, self.method, self.apply = gather, rank, method, apply

    def load(self, path: Path):
        """Every rank reads rank 0's file (tensors and plain types only) and applies it (`apply(state)`:
        the framework's load_state_dict); yields each phase's name as it ends."""
        import torch
        if self.apply is None:
            raise NotImplementedError("this framework's saver does not load")
        state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=True)
        yield "read_s"
        self.apply(state)
        yield "apply_s"

    def save(self, path: Path, mode: str) -> Save:
        import torch
        state = self.gather()
        nbytes = 0
        if self.rank == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
            with open(Path(path) / "state.pt", "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(Path(path))
            nbytes = (Path(path) / "state.pt").stat().st_size
        return Save(str(path), nbytes=nbytes)
