"""DeepSpeed ZeRO stages 0-3 and ZeRO-3 with optimizer + parameter offload.

The DeepSpeed config JSON is built from Hydra (run.* for batch sizes and precision, options for
ZeRO) and recorded verbatim in native_config. Recommended settings from the DeepSpeed docs:
overlap_comm, contiguous_gradients, 5e8-element buckets. The optimizer is the run's torch
optimizer (same math as every other framework), except with offload, where ZeRO-Offload
requires DeepSpeedCPUAdam (DeepSpeed's "AdamW" type; cpu_adam JIT-builds once with ninja).
"""
from __future__ import annotations

import importlib.util
import logging
from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ddlbench.adapters.base import StepOut, Strategy
from ddlbench.adapters.common import batch_norms, build_on, param_row, split_micro, unwrap
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, StepRules, buckets, low, split
from ddlbench.adapters.optim import param_groups
from ddlbench.adapters.parallelize import apply_checkpointing, apply_float8
from ddlbench.adapters.precision import DTYPES, FrameworkCast
from ddlbench.adapters.variant import Abilities, Variant, payload_psi, taxonomy_labels
from ddlbench.metrics.comm import AnalyticComm
from ddlbench.models.checkpointing import Policy
from ddlbench.models.checkpointing import describe as describe_ac


class DeepSpeedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    stage: Literal[0, 1, 2, 3] = 2
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: PositiveInt = 500_000_000
    allgather_bucket_size: PositiveInt = 500_000_000
    stage3_prefetch_bucket_size: PositiveInt = 50_000_000
    stage3_param_persistence_threshold: int = Field(100_000, ge=0)
    stage3_max_live_parameters: int = Field(1_000_000_000, ge=0)     # DeepSpeed's defaults, recorded
    stage3_max_reuse_distance: int = Field(1_000_000_000, ge=0)
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"
    # DeepSpeed recommends DeepSpeedCPUAdam with offload (fast, vectorised); "torch" keeps the
    # run's torch optimizer (zero_force_ds_cpu_optimizer=false): slower, bitwise DDP's math.
    offload_optimizer_impl: Literal["ds_cpu_adam", "torch"] = "ds_cpu_adam"
    # DeepSpeed's gradient communication dtype ("communication_data_type"): fp16/bf16 halve the
    # bytes (lossy); null = DeepSpeed's default (the training dtype)
    communication_data_type: Optional[Literal["fp16", "bf16", "fp32"]] = None
    loss_scale: float = Field(0.0, ge=0)      # fp16 only; 0 = dynamic
    initial_scale_power: int = Field(16, ge=0)
    # torch's checkpoint wrappers on the model's blocks before the engine takes it (as the HF
    # Trainer does with DeepSpeed; deepspeed.checkpointing is Megatron's reentrant API)
    activation_checkpointing: Policy = "none"


def _cpu_fp16_ok() -> bool:
    """DeepSpeed's CPU accelerator (is_fp16_supported) asks oneDNN whether this CPU has fp16."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:
        return False


def precision_reason(device_type: str, precision: str, cpu_fp16_ok: bool) -> Optional[str]:
    """Why DeepSpeed cannot run this precision here (its engine raises "Type fp16 is not supported
    on your device" after the ranks start), or None."""
    if device_type == "cpu" and precision == "fp16" and not cpu_fp16_ok:
        return ("DeepSpeed on CPU runs fp16 only where oneDNN supports it (its CPU accelerator's "
                "is_fp16_supported); this CPU does not: use bf16 or fp32")
    return None


class DeepSpeed(Variant):
    name = "deepspeed"
    Options = DeepSpeedOptions
    strategy = "ddlbench.adapters.deepspeed:DeepSpeedStrategy"
    # imported once by the launcher before it forks CPU ranks, not by each rank (4.8 s median of a
    # rank's model_build in the suite's runs): deepspeed, and the Muon optimizer module that every
    # ZeRO engine imports at initialize (zero/utils.py: is_zero_supported_optimizer), whose
    # torch.compile decorator pulls in torch's compiler
    preload_modules = ("deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer")

    def abilities(self):
        s = self.options.stage     # compiles through its engine (DeepSpeedEngine.compile)
        step = StepRules("units") if s == 3 else StepRules("buckets", bucket_elements=self.options.reduce_bucket_size,
                                                           gather_after_step=True, reduce_every_micro_batch=s == 2)
        return Abilities(compiles=True, float8=True, shards_model_state=True, step=step, checkpoints=("sync",))

    def taxonomy(self) -> dict:
        options = self.options
        shard = {0: "none", 1: "optimizer state", 2: "gradients + optimizer state",
                 3: "parameters + gradients + optimizer state"}[options.stage]
        if "cpu" in (options.offload_optimizer, options.offload_param):
            shard += ", offloaded to CPU"
        pattern = {0: "all-reduce", 1: "all-reduce + all-gather", 2: "reduce-scatter + all-gather",
                   3: "all-gather + reduce-scatter"}[options.stage]
        return taxonomy_labels("data (ZeRO)" if options.stage else "data", "sync", pattern, shard,
                               options.communication_data_type if options.communication_data_type in ("fp16", "bf16") else "none")

    def cost_model(self, dims, model, precision, per_node=None):
        """DeepSpeed 0.19's engine, as measured here (gpt2_tiny, 2 ranks, grad_accum 1 and 2:
        tests/test_cost_model.py): at bf16/fp16 it holds 2-byte parameters and gradients and an
        fp32 master copy in the optimizer; gradients cross in grad_reduce_dtype, parameters in the
        training dtype.
        0: engine.allreduce_gradients: an all-reduce per reduce bucket, at the accumulation boundary.
        1: the same all-reduce (use_multi_rank_bucket_allreduce) at the boundary, then all_gather_dp_groups
           of the updated partitions; 2: the all-reduce on every micro-step (gradients are partitioned
           as backward produces them), the all-gather once. Buffers: the fp32 partition of the averaged
           gradients, and with contiguous_gradients the reduce bucket, allocated at its full
           reduce_bucket_size elements whatever the model's size, twice with overlap_comm
           (stage_1_and_2.py: setup_buckets; found by torch's MemTracker: benchmarks/memory_check.py).
        3: reduce-scatter of gradients on every micro-step; parameters all-gathered per module, once per
           step while the model fits in stage3_max_live_parameters (forward's gathers survive backward
           and the next micro-batches), else in forward and backward of every micro-batch (upper bound).
           The gathered parameters stay on the device: up to max_live_parameters of them. Parameters
           of at most stage3_param_persistence_threshold elements are kept whole on every rank (their
           partition beside them) and not counted among the gathered. With
           contiguous_gradients one reduce bucket of reduce_bucket_size elements (stage3.py, at init).
        Stage 0 at bf16/fp16 (no grad_accum_dtype): the engine wraps the optimizer in FP16_Optimizer
        (engine._do_optimizer_sanity_check: DDP_BFLOAT16 / FP16; fused or unfused), whose step hands
        the fp32 master weights an fp32 copy of every gradient (fused_optimizer.py step: flattened
        `p.grad.to(fp32)`), freed after the step: 4 B per parameter at the step's peak (found by
        MemTracker at bf16: the estimate was 4P short, -15.5%)."""
        o, dp, p = self.options, dims.dp, model.params
        s = o.stage
        state = 2 if low(precision) else 4
        grad_wire = DTYPE_BYTES.get(self.grad_reduce_dtype(precision), 4)
        grads, params = grad_wire * p, state * p
        accum = dims.grad_accum
        reduce_msgs = buckets(grads, grad_wire * o.reduce_bucket_size)
        buffers: dict = {}
        persistent = 0
        if s == 3:
            fits = p <= o.stage3_max_live_parameters
            traffic = (split("all_gather", params, model.units, dp, per_step=1 if fits else 2 * accum, what="parameters")
                       + split("reduce_scatter", grads, model.units, dp, per_step=accum, what="gradients"))
            # parameters of at most stage3_param_persistence_threshold elements stay whole on every rank
            # beside their partition (parameter_offload.py: mark_persistent_parameters)
            persistent = model.params_at_most(o.stage3_param_persistence_threshold)
            if dp > 1:
                buffers["gathered parameters (kept from forward to backward)"] = state * min(p - persistent,
                                                                                             o.stage3_max_live_parameters)
                buffers["one unit's gradients before reduce-scatter"] = state * model.largest_block_params
        else:
            traffic = split("all_reduce", grads, reduce_msgs, dp, per_step=accum if s == 2 else 1, what="gradients")
            if s in (1, 2):
                traffic += split("all_gather", params, buckets(params, state * o.allgather_bucket_size), dp,
                                 what="parameters")
                if dp > 1:
                    buffers["fp32 partition of the averaged gradients"] = 4.0 * p / dp
        if o.contiguous_gradients and s >= 1:
            copies = 2 if o.overlap_comm and s < 3 else 1
            buffers["reduce bucket (contiguous_gradients, full reduce_bucket_size)"] = copies * state * o.reduce_bucket_size
        return CostModel(
            f"DeepSpeed 0.19 ZeRO stage {s}", p, shard_ranks=dp, shard_optimizer=s >= 1, shard_grads=s >= 2,
            shard_params=s >= 3, persistent_params=persistent, param_bytes=state, grad_bytes=state, fp32_master_copy=low(precision),
            offload_optimizer=o.offload_optimizer != "none", offload_params=o.offload_param != "none",
            buffers=buffers, traffic=tuple(traffic), step_grad_copy_bytes=4 if s == 0 and low(precision) else 0)

    def parallel_shape(self, cfg) -> dict:
        """ZeRO-3 shards the parameters over every rank (dp_shard = the world); stages 0-2 keep a
        whole replica of them on each (dp_replicate), sharding optimizer state (and gradients)."""
        return {"dp_shard": -1, "dp_replicate": 1} if self.options.stage == 3 else {}

    def check_config(self, cfg, dims) -> None:
        from ddlbench.errors import ConfigError
        options = self.options
        if options.offload_param != "none" and options.stage != 3:
            raise ConfigError("framework.options.offload_param needs stage 3 (ZeRO-Infinity)")
        if options.offload_optimizer != "none" and options.stage == 0:
            raise ConfigError("framework.options.offload_optimizer needs stage >= 1")

    def unsupported_reason(self, cfg, device_type: str) -> Optional[str]:
        if importlib.util.find_spec("deepspeed") is None:
            return "deepspeed is not installed (pip install 'ddlbench[deepspeed]')"
        return (precision_reason(device_type, cfg.run.precision, device_type == "cpu" and _cpu_fp16_ok())
                or super().unsupported_reason(cfg, device_type))

    def grad_reduce_dtype(self, precision: str) -> str:
        """communication_data_type, or DeepSpeed's default: the training dtype (bf16 engines reduce in bf16)."""
        return self.options.communication_data_type or precision

    def analytic_comm(self, dims, precision, params, per_node=None) -> Optional[AnalyticComm]:
        """The cost model's payloads (cost_model's docstring: per stage, per micro-step where
        DeepSpeed reduces per micro-step), with the code path and the paper's figure beside them."""
        s = self.options.stage
        payload = payload_psi(self, dims, precision, params, per_node)
        if s == 0:
            return AnalyticComm(payload, "DeepSpeed 0.19 engine.allreduce_gradients",
                                paper_psi=2.0, paper="ZeRO paper, data parallelism")
        if s in (1, 2):
            return AnalyticComm(payload,
                                "DeepSpeed 0.19 stage_1_and_2.py: average_tensor -> allreduce_and_scatter "
                                "(use_multi_rank_bucket_allreduce=True"
                                + (", on every micro-step" if s == 2 else ", at the accumulation boundary")
                                + "), step -> all_gather_dp_groups",
                                paper_psi=2.0, paper=f"ZeRO paper, stage {s}")
        fits = (params or 0) <= self.options.stage3_max_live_parameters
        how = ("the model fits in stage3_max_live_parameters: gathered once per step" if fits else
               "upper bound: gathered in forward and backward of every micro-batch")
        return AnalyticComm(payload,
                            "DeepSpeed 0.19 stage3.py / partitioned_param_coordinator.py: reduce-scatter of "
                            "gradients on every micro-step, all-gather of parameters per module; " + how,
                            paper_psi=3.0, paper="ZeRO paper, stage 3")


class DeepSpeedStrategy(Strategy):
    def ds_config(self, optim_cfg, batch_norm: bool = False) -> dict:
        """The engine's config. `batch_norm`: the model has BatchNorm layers (see below)."""
        o, d = self.options, self.dims
        zero = {"stage": o.stage, "overlap_comm": o.overlap_comm,
                "contiguous_gradients": o.contiguous_gradients,
                "reduce_bucket_size": o.reduce_bucket_size,
                "allgather_bucket_size": o.allgather_bucket_size}
        if o.stage == 3:
            zero.update(stage3_prefetch_bucket_size=o.stage3_prefetch_bucket_size,
                        stage3_param_persistence_threshold=o.stage3_param_persistence_threshold,
                        stage3_max_live_parameters=o.stage3_max_live_parameters,
                        stage3_max_reuse_distance=o.stage3_max_reuse_distance)
        if o.offload_optimizer != "none":
            zero["offload_optimizer"] = {"device": o.offload_optimizer, "pin_memory": self.ctx.device.type == "cuda"}
        if o.offload_param != "none":
            zero["offload_param"] = {"device": o.offload_param, "pin_memory": self.ctx.device.type == "cuda"}
        cfg = {
            "train_batch_size": d.global_batch,
            "train_micro_batch_size_per_gpu": d.micro_batch,
            "gradient_accumulation_steps": d.grad_accum,
            "zero_optimization": zero,
            "bf16": {"enabled": self.ctx.precision == "bf16"},
            "fp16": {"enabled": self.ctx.precision == "fp16", "loss_scale": o.loss_scale,
                     "initial_scale_power": o.initial_scale_power},
            # DeepSpeed >= 0.18 clips gradients at 1.0 unless told otherwise: a silent change of
            # the optimizer that the equivalence gate caught. The run declares no clipping.
            "gradient_clipping": 0.0,
            "zero_force_ds_cpu_optimizer": o.offload_optimizer_impl == "ds_cpu_adam",
            # ZeRO >= 1 refuses client optimizers outside its tested list (Adam/AdamW/Adagrad/Lion)
            # unless allowed. It steps them on flat fp32 partitions; torch SGD's update (momentum
            # per element) is element-wise, so the math is DDP's: tests/test_convex.py checks
            # that ZeRO-2 + SGD reaches the convex optimum.
            "zero_allow_untested_optimizer": optim_cfg.name == "sgd" and o.stage >= 1,
            "steps_per_print": 10**9,
            # DeepSpeed's own throughput timer synchronises the device at every micro-step's start
            # and stop ("synchronized": true by default): keep the timer, drop its syncs, so the
            # runner measures DeepSpeed's step as it runs without the benchmark
            "timers": {"throughput": {"enabled": True, "synchronized": False}},
            "wall_clock_breakdown": False,
        }
        if o.communication_data_type:
            cfg["communication_data_type"] = o.communication_data_type
        if batch_norm and self.ctx.precision in ("bf16", "fp16"):
            # DeepSpeed >= 0.19 casts parameters but keeps buffers fp32 unless data_types.buffer_dtype
            # says otherwise; cuDNN's batch norm then fails in backward ("Expected running_mean to
            # have type BFloat16 but got Float", seen on an H100). Its buffers in the training dtype
            # are what module.bfloat16() gave before 0.19.
            cfg["data_types"] = {"buffer_dtype": self.ctx.precision}
        if self._offload:
            if optim_cfg.name != "adamw":
                from ddlbench.errors import UnsupportedError
                raise UnsupportedError("ZeRO-Offload here uses DeepSpeedCPUAdam; run optim=adamw")
            cfg["optimizer"] = {"type": "AdamW", "params": {
                "lr": optim_cfg.lr, "betas": list(optim_cfg.betas), "eps": optim_cfg.eps,
                "weight_decay": optim_cfg.weight_decay}}
        return cfg

    @property
    def _offload(self) -> bool:
        """Offload with DeepSpeed's own CPU optimizer (built from the config, not the client)."""
        o = self.options
        return (o.offload_optimizer != "none" or o.offload_param != "none") and o.offload_optimizer_impl == "ds_cpu_adam"

    def checkpoint_saver(self, group):
        """DeepSpeed saves through its engine (its recommended way), synchronously."""
        from ddlbench.adapters.checkpoint import EngineSaver
        return EngineSaver(self.model, self.ctx.rank)

    def setup(self, build_model, build_optimizer) -> None:
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend=self.ctx.backend)  # reuses the launcher's group
        model = build_on(build_model, self.ctx.device)
        self.float8 = apply_float8(model) if self.ctx.float8 else None   # before the engine wraps it
        self.params = sum(p.numel() for p in model.parameters())
        model = self.prepare_model(model)
        if self.options.activation_checkpointing != "none":     # on the blocks the engine will hold
            apply_checkpointing(model, self.options.activation_checkpointing)
        self.config = self.ds_config(build_optimizer.optim_cfg, batch_norm=bool(batch_norms(model)))
        oc = build_optimizer.optim_cfg   # the config-built optimizer gets the same decay groups
        groups = self.optimizer_groups(param_groups(model.parameters(), oc.weight_decay, oc.exclude_from_decay))
        optimizer = None if self._offload else build_optimizer(groups)
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config,
            model_parameters=groups if optimizer is None else None, **self.initialize_kwargs())
        self.version = deepspeed.__version__
        self.compiled = None
        if self.ctx.compile:     # DeepSpeed's own API: the engine compiles its module
            self.model.compile()
            self.compiled = "DeepSpeedEngine.compile() (torch.compile of the engine's module)"
        if self.ctx.precision != "fp32":     # the engine runs in its configured precision
            self.precision = FrameworkCast(
                self.ctx.device, self.ctx.precision, self._precision_summary(), input_dtype=DTYPES[self.ctx.precision],
                master_weights="fp32 in the optimizer",
                loss_scaling=None if self.ctx.precision != "fp16" else (
                    f"DeepSpeed static loss scale {self.options.loss_scale:g}" if self.options.loss_scale
                    else "DeepSpeed dynamic loss scale"))

    def prepare_model(self, model):
        """The model as the engine takes it (DeepSpeed-MoE swaps in its MoE layers here)."""
        return model

    def initialize_kwargs(self) -> dict:
        """More keywords for deepspeed.initialize (Ulysses: its mpu, the sequence-parallel groups)."""
        return {}

    def optimizer_groups(self, groups: list[dict]) -> list[dict]:
        """The optimizer's parameter groups (DeepSpeed-MoE keeps experts in groups of their own)."""
        return groups

    def train_step(self, batch: dict) -> StepOut:
        engine = self.model
        micro = split_micro(batch, self.dims.grad_accum)
        total = torch.zeros((), device=self.ctx.device)
        for mb in micro:
            loss = engine(**self.precision.inputs(mb))
            engine.backward(loss)  # scales by 1/grad_accum and the fp16 loss scale itself
            engine.step()          # applies the update only at the accumulation boundary
            total += loss.detach().float()
        return StepOut(loss=total / len(micro))

    def _precision_summary(self) -> str:
        comm = self.options.communication_data_type or f"{self.ctx.precision} (DeepSpeed's default: the model dtype)"
        return (f"DeepSpeed engine {self.ctx.precision}: {self.ctx.precision} parameters and gradients, fp32 master "
                f"copy in the optimizer; gradient communication in {comm}")

    def param_stats(self) -> list[tuple[int, list[float]]]:
        if self.options.stage != 3:
            return super().param_stats()
        import deepspeed
        params = list(unwrap(self.model).parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [(p.ndim, param_row(p)) for p in params]

    def describe(self) -> dict:
        native = {"deepspeed_config": self.config, "backend": self.ctx.backend,
                  "optimizer": ("DeepSpeedCPUAdam (config type AdamW)" if self._offload
                                else f"client {type(self.optimizer.optimizer if hasattr(self.optimizer, 'optimizer') else self.optimizer).__name__}"),
                  "compile": self.compiled, "float8": self.float8,
                  "activation_checkpointing": describe_ac(self.options.activation_checkpointing)}
        return {"version": self.version, "native_config": native,
                "optimizer_impl": "DeepSpeedCPUAdam" if self._offload else None}
