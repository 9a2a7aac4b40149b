"""Horovod: hvd.DistributedOptimizer (ring all-reduce with tensor fusion), optional fp16
compression and backward_passes_per_step for accumulation. Launched with horovodrun --gloo.

Horovod's examples scale the learning rate by hvd.size(); this adapter does not (the run's LR
is the run's LR) and records that. Collectives bypass c10d, so the adapter counts its own:
every allreduce the optimizer issues, with the (possibly compressed) payload size.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from ddlbench.adapters.base import CountsOwnCollectives, StepOut, Strategy
from ddlbench.adapters.common import build_on, split_micro
from ddlbench.adapters.cost import CostModel, MiB, autocast_copies, buckets, split
from ddlbench.adapters.parallelize import apply_compile, apply_float8
from ddlbench.adapters.variant import Abilities, Variant, payload_psi, taxonomy_labels
from ddlbench.machine.device import HARNESS_BACKEND_ENV
from ddlbench.metrics.comm import AnalyticComm, CommCounter, IssueLog, device_clock

# Horovod 0.28.1's fusion buffer when HOROVOD_FUSION_THRESHOLD is unset: 128 MiB
# (horovod/common/operations.cc: SetTensorFusionThresholdBytes(128 * 1024 * 1024); horovodrun's
# --fusion-threshold-mb help says the same). Its docs/tensor-fusion.md still says 64 MB, the
# default of older releases.
DEFAULT_FUSION_THRESHOLD_MB = 128


class HorovodOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    fp16_compression: bool = False
    fusion_threshold_mb: Optional[float] = None   # None = Horovod's default (DEFAULT_FUSION_THRESHOLD_MB); 0 = no fusion


class Horovod(Variant):
    name = "horovod"
    Options = HorovodOptions
    strategy = "ddlbench.adapters.horovod:HorovodStrategy"
    rank_starter = "ddlbench.launch.horovod:Horovodrun"   # horovodrun here; its slots and rendezvous under srun

    def abilities(self):
        return Abilities(compiles=True, float8=True, own_collectives=True, checkpoints=("sync",),
                         fake_group="Horovod's collectives bypass c10d (its own background thread and MPI/gloo rings)")

    def taxonomy(self) -> dict:
        return taxonomy_labels("data", "sync", "all-reduce (ring, tensor fusion)",
                               compression="fp16" if self.options.fp16_compression else "none")

    def cost_model(self, dims, model, precision, per_node=None):
        """hvd.DistributedOptimizer: one all-reduce per fusion buffer of gradients after the last
        of backward_passes_per_step (once per step), fp16 on the wire with compression; the fusion
        buffer itself on the device. Fusion off: one message per gradient (here per unit)."""
        options, psi, dp = self.options, 4.0 * model.params, dims.dp
        fusion = (DEFAULT_FUSION_THRESHOLD_MB if options.fusion_threshold_mb is None
                  else options.fusion_threshold_mb) * MiB
        buffers = autocast_copies(model.params, precision)
        if fusion and dp > 1:
            buffers["fusion buffer"] = min(fusion, psi)
        payload = psi * (0.5 if options.fp16_compression else 1.0)
        traffic = split("all_reduce", payload, buckets(psi, fusion) if fusion else model.units, dp, what="gradients")
        return CostModel(f"Horovod DistributedOptimizer, fusion threshold {fusion / MiB:g} MiB"
                         + (", fp16 compression" if options.fp16_compression else ""),
                         model.params, shard_ranks=dp, buffers=buffers, traffic=tuple(traffic))

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if importlib.util.find_spec("horovod") is None:
            return "horovod is not installed (build it with scripts/build_horovod.sh)"
        return super().unsupported_reason(cfg, device_type)

    def launch_env(self) -> dict:
        # the harness's own gathers over gloo: a rank's one NCCL is Horovod's (ddlbench/machine/device.py)
        env = {HARNESS_BACKEND_ENV: "gloo"}
        if self.options.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(self.options.fusion_threshold_mb * 2**20))
        return env

    def grad_reduce_dtype(self, precision: str) -> str:
        return "fp16" if self.options.fp16_compression else "fp32"

    def analytic_comm(self, dims, precision, params, per_node=None) -> Optional[AnalyticComm]:
        if self.options.fp16_compression:
            return None
        return AnalyticComm(payload_psi(self, dims, precision, params, per_node),
                            "hvd.DistributedOptimizer: one allreduce per gradient (fused)",
                            paper_psi=2.0, paper="ZeRO paper, data parallelism")


class HorovodStrategy(CountsOwnCollectives, Strategy):
    def checkpoint_saver(self, group):
        """Rank 0's torch.save of the model and optimizer (Horovod's examples save so)."""
        from ddlbench.adapters.checkpoint import Rank0Saver
        return Rank0Saver(lambda: {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                          self.ctx.rank, "rank 0's torch.save of the model's and optimizer's state dicts, fsynced "
                                         "(Horovod's examples)", apply=self._load_state)

    def _load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def setup(self, build_model, build_optimizer) -> None:
        import horovod
        import horovod.torch as hvd
        from horovod.torch import optimizer as hvd_optimizer

        hvd.init()
        o = self.options
        model = build_on(build_model, self.ctx.device)
        self.float8 = apply_float8(model) if self.ctx.float8 else None   # before compile and the optimizer
        self.params = sum(p.numel() for p in model.parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.compiled = apply_compile(model) if self.ctx.compile else None   # the optimizer hooks stay outside
        compression = hvd.Compression.fp16 if o.fp16_compression else hvd.Compression.none
        self.counter = CommCounter()
        # when backward handed each gradient over (Horovod sends while backward runs): on a GPU timed
        # by CUDA events on the compute stream, not the host's clock (it runs ahead of the kernels)
        self.issues = IssueLog(*device_clock(self.ctx.device))
        self._count_allreduces(hvd_optimizer)
        base = build_optimizer(model.parameters())
        self.optimizer = hvd.DistributedOptimizer(
            base, named_parameters=model.named_parameters(), compression=compression,
            backward_passes_per_step=self.dims.grad_accum, op=hvd.Average)
        # No hvd.broadcast_optimizer_state: on a fresh optimizer it initialises the state by
        # running step() on zero gradients, which advances Adam's step count and changes every
        # later update (the equivalence gate caught it). A fresh optimizer has nothing to sync.
        self.model = model
        self.version = horovod.__version__

    def _count_allreduces(self, module) -> None:
        """Wrap the allreduce entry points the DistributedOptimizer calls."""
        counter, issues = self.counter, self.issues
        for name in ("allreduce_async_", "grouped_allreduce_async_"):
            original = getattr(module, name, None)
            if original is None or getattr(original, "_ddlbench_counted", False):
                continue

            def counted(tensor, *args, _orig=original, **kwargs):
                tensors = tensor if isinstance(tensor, (list, tuple)) else [tensor]
                nbytes = sum(t.numel() * t.element_size() for t in tensors)
                counter.add("all_reduce", nbytes)
                issues.add("all_reduce", nbytes)
                return _orig(tensor, *args, **kwargs)

            counted._ddlbench_counted = True
            setattr(module, name, counted)

    def train_step(self, batch: dict) -> StepOut:
        micro = split_micro(batch, self.dims.grad_accum)
        total = torch.zeros((), device=self.ctx.device)
        for mb in micro:  # Horovod all-reduces after the last of backward_passes_per_step
            with self.precision.forward_context():
                loss = self.model(**mb)
            self.precision.backward(loss / len(micro))
            total += loss.detach().float()
        self.issues.compute_end()   # backward is done: from here the step waits for the all-reduces
        scaler = self.precision.scaler
        if scaler:  # Horovod's AMP recipe: synchronize, unscale, then step without re-sync
            self.optimizer.synchronize()
            scaler.unscale_(self.optimizer)
            with self.optimizer.skip_synchronize():
                scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()  # Horovod's override takes no set_to_none (torch default: None)
        self.issues.step_end()
        return StepOut(loss=total / len(micro))

    def comm_stats(self) -> Optional[dict]:
        counts, issued = self.counter.take(), self.issues.take()
        for kind, profile in issued.items():
            if kind in counts:
                counts[kind]["issued"] = profile
        return counts

    def describe(self) -> dict:
        import horovod.torch as hvd
        o = self.options
        native = {"optimizer": "hvd.DistributedOptimizer", "op": "Average",
                  "compression": "fp16" if o.fp16_compression else "none",
                  "backward_passes_per_step": self.dims.grad_accum,
                  "lr_scaled_by_world_size": False, "compile": self.compiled, "float8": self.float8,
                  "fusion_threshold_mb": (DEFAULT_FUSION_THRESHOLD_MB if o.fusion_threshold_mb is None
                                          else o.fusion_threshold_mb),
                  "controller": "gloo" if hvd.gloo_enabled() else "mpi",
                  "built": {"gloo": hvd.gloo_built(), "mpi": hvd.mpi_built(), "nccl": bool(hvd.nccl_built())}}
        return {"version": self.version, "native_config": native}
