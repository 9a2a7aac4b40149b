"""Typed schema of the resolved config. Unknown keys and impossible values are errors.

Framework options are validated by the adapter's own `Options` model (ddlbench/adapters), so
adding a framework does not touch this file.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

PRECISIONS = ("fp32", "bf16", "fp16")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FrameworkCfg(Strict):
    name: str
    variant: str = "default"
    equivalent_to_ddp: bool = True   # mathematically equal to DDP (the equivalence gate applies)
    loss_rtol_vs_ddp: Annotated[float, Field(gt=0, lt=1)] = 1e-5  # the gate's stated tolerance
    adapter: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    options: dict[str, Any] = {}


class MoECfg(Strict):
    """A Mixture-of-Experts MLP in every layer (families with experts: qwen3_moe, mixtral): a softmax
    top-k router over `num_experts` SwiGLU experts of width `intermediate_size`; dropless."""
    num_experts: Annotated[int, Field(ge=2)]
    top_k: PositiveInt                              # experts per token
    intermediate_size: PositiveInt                  # one expert's SwiGLU width
    norm_topk_prob: bool = True                     # renormalise the top-k weights to sum to 1
    # a shared expert every token goes through beside its routed ones (Qwen2-MoE / DeepSeek-style), its
    # SwiGLU width; null: none
    shared_intermediate_size: Optional[PositiveInt] = None
    aux_loss_coef: Annotated[float, Field(ge=0.0)] = 0.001   # load-balancing loss weight (0: none)
    # DeepSeek-V3's layout (family deepseek_v3 only): the first layers dense (SwiGLU of the model's
    # intermediate_size); sigmoid scores routed within the topk_group best of n_group expert groups, the
    # weights scaled by routed_scaling_factor
    first_k_dense: Annotated[int, Field(ge=0)] = 0
    n_group: Optional[PositiveInt] = None
    topk_group: Optional[PositiveInt] = None
    routed_scaling_factor: Annotated[float, Field(gt=0.0)] = 1.0
    # transformers' experts implementation: auto = grouped_mm on CUDA, the per-expert loop (eager) on CPU
    experts_implementation: Literal["auto", "eager", "grouped_mm", "batched_mm"] = "auto"

    @model_validator(mode="after")
    def _top_k_fits(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"moe.top_k {self.top_k} is larger than moe.num_experts {self.num_experts}")
        return self


class MLACfg(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values made from a compressed latent of
    kv_lora_rank (plus a shared rotary key of qk_rope_head_dim), queries from one of q_lora_rank (null:
    a full query projection); per head qk_nope_head_dim + qk_rope_head_dim for the scores, v_head_dim
    for the values."""
    q_lora_rank: Optional[PositiveInt] = None
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class LanguageModelCfg(Strict):
    """A decoder-only language model through transformers, random init (nothing downloaded), of a
    model family (ddlbench/models/families/: gpt2, llama, qwen3, qwen3_moe, mixtral, ...). One
    vocabulary for all: n_layer, n_embd (hidden size), n_head; a family names the other keys it
    needs and may take (the rest stay null)."""
    name: str
    kind: Literal["language"]
    family: str = "gpt2"
    n_layer: PositiveInt
    n_embd: PositiveInt
    n_head: PositiveInt
    vocab_size: Annotated[int, Field(ge=2)]
    seq_len: PositiveInt
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    # auto: eager on CPU (deterministic, identical across frameworks: the equivalence gate),
    # sdpa_causal on CUDA (SDPA's fused/flash kernels with is_causal, no mask built, so no forward reads
    # a tensor on the host; `sdpa` keeps transformers' mask logic); recorded in the result
    attention: Literal["auto", "eager", "sdpa", "sdpa_causal"] = "auto"
    # GPT-2's activation: auto = gelu_pytorch_tanh on CUDA (the same function in one kernel), gelu_new
    # (GPT-2's own, a chain of elementwise ops) on CPU; the Llama-like families' is SiLU (SwiGLU)
    activation: Literal["auto", "gelu_new", "gelu_pytorch_tanh"] = "auto"
    # the embedding and head rows padded to a multiple of this (tensor cores); auto = 64 on CUDA, 1 on
    # CPU; the data's tokens stay below vocab_size (nanoGPT's 50304 for GPT-2)
    pad_vocab_to: Union[Literal["auto"], PositiveInt] = "auto"
    # family keys (ddlbench/models/family.py FAMILY_KEYS; null where the family has none):
    n_kv_head: Optional[PositiveInt] = None          # grouped-query attention's key/value heads
    intermediate_size: Optional[PositiveInt] = None  # the dense SwiGLU MLP's width
    rope_theta: Optional[float] = None               # rotary base
    rms_norm_eps: Optional[float] = None
    tie_embeddings: Optional[bool] = None            # LM head shares the embedding (Llama 3.2 1B/3B)
    head_dim: Optional[PositiveInt] = None           # per-head width where it is not n_embd / n_head (Qwen3)
    moe: Optional[MoECfg] = None                     # the experts (MoE families)
    mla: Optional[MLACfg] = None                     # multi-head latent attention (deepseek_v3)
    sliding_window: Optional[PositiveInt] = None     # every second layer's attention window (gpt_oss)
    # run.global_batch=auto on GPUs: this many samples per device (the batch that keeps one GPU busy;
    # null: 8 in all, as on CPU). ddlbench/machine/device.py::auto_global_batch
    gpu_batch_per_device: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _shapes_fit(self):
        from ddlbench.errors import ConfigError
        from ddlbench.models import family as families
        try:
            fam = families.get(self.family)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        errors = families.key_errors(fam, {k: getattr(self, k) for k in families.FAMILY_KEYS}) + fam.check(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self


class VitCfg(Strict):
    patch_size: PositiveInt
    num_layers: PositiveInt
    num_heads: PositiveInt
    hidden_dim: PositiveInt
    mlp_dim: PositiveInt


VISION_ARCHS = ("resnet18", "resnet50", "resnet152", "vgg16", "vit_b_16", "vit", "logreg")


class VisionModelCfg(Strict):
    name: str
    kind: Literal["vision"]
    arch: Literal[VISION_ARCHS]  # type: ignore[valid-type]
    image_size: Annotated[int, Field(ge=8)]
    num_classes: Annotated[int, Field(ge=2)]
    channels: PositiveInt = 3     # input channels; torchvision nets take 3, logreg any
    vit: Optional[VitCfg] = None
    # convolutions in NHWC (tensor cores' layout); auto = on CUDA for convolutional nets
    channels_last: Union[Literal["auto"], bool] = "auto"
    # run.global_batch=auto on GPUs: this many samples per device (the batch that keeps one GPU busy;
    # null: 8 in all, as on CPU). ddlbench/machine/device.py::auto_global_batch
    gpu_batch_per_device: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _vit_needs_shape(self):
        if self.channels != 3 and self.arch != "logreg":
            raise ValueError(f"arch '{self.arch}' takes 3 input channels, not model.channels {self.channels}")
        if self.arch == "vit" and self.vit is None:
            raise ValueError("arch 'vit' needs a model.vit block (patch_size, num_layers, ...)")
        if self.vit is not None and self.image_size % self.vit.patch_size:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch_size")
        return self


ModelCfg = Annotated[Union[LanguageModelCfg, VisionModelCfg], Field(discriminator="kind")]


class SyntheticDataCfg(Strict):
    name: Literal["synthetic"]
    pool_batches: PositiveInt = 4


class _GeneratedDataCfg(Strict):
    """A seeded synthetic task with a known floor; `seed` fixes the task, not the training."""
    train_samples: PositiveInt = 1024
    val_samples: PositiveInt = 256
    seed: NonNegativeInt = 1234


class MarkovDataCfg(_GeneratedDataCfg):
    name: Literal["markov"]
    states: Annotated[int, Field(ge=2)] = 32
    concentration: Annotated[float, Field(gt=0)] = 0.1


class BlobsDataCfg(_GeneratedDataCfg):
    name: Literal["blobs"]
    noise: Annotated[float, Field(ge=0)] = 0.5
    label_noise: Annotated[float, Field(ge=0, lt=1)] = 0.1


class DigitsDataCfg(Strict):
    name: Literal["digits"]
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.2   # 0: every sample trains, no validation
    split_seed: NonNegativeInt = 0
    features: Literal["upscaled", "raw"] = "upscaled"  # raw: 1 x 8 x 8 in [0, 1], no resampling
    train_samples: Optional[PositiveInt] = None        # keep the first k training samples (seeded order)


class ImageFolderDataCfg(Strict):
    name: Literal["imagefolder"]
    path: str
    train_dir: str = "train"
    val_dir: str = "val"
    num_workers: NonNegativeInt = 0


class TextDataCfg(Strict):
    name: Literal["text"]
    path: str
    train_file: str = "wiki.train.tokens"
    val_file: str = "wiki.valid.tokens"
    tokenizer: Literal["byte", "gpt2"] = "byte"
    tokenizer_dir: Optional[str] = None
    num_workers: NonNegativeInt = 0

    @model_validator(mode="after")
    def _gpt2_needs_files(self):
        if self.tokenizer == "gpt2" and not self.tokenizer_dir:
            raise ValueError("tokenizer gpt2 needs data.tokenizer_dir (vocab.json + merges.txt)")
        return self


DataCfg = Annotated[Union[SyntheticDataCfg, MarkovDataCfg, BlobsDataCfg, DigitsDataCfg,
                          ImageFolderDataCfg, TextDataCfg], Field(discriminator="name")]


class OptimCfg(Strict):
    name: Literal["adamw", "sgd"]
    lr: Annotated[float, Field(gt=0)]
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: Annotated[float, Field(gt=0)] = 1e-8
    momentum: Annotated[float, Field(ge=0)] = 0.0
    # bias_and_norm: parameters with fewer than 2 dimensions (biases, norm scales/shifts) get
    # weight_decay 0, the usual exclusion (GPT-2/nanoGPT, torchvision recipes); none: all decay
    exclude_from_decay: Literal["none", "bias_and_norm"] = "none"
    # the update's implementation (ddlbench/adapters/optim.py::optimizer_impl): auto = fused on CUDA (one
    # kernel for every parameter, torchtitan's default), torch's for-loop on CPU
    impl: Literal["auto", "fused", "foreach", "for_loop"] = "auto"


class LauncherCfg(Strict):
    name: Literal["local", "slurm"]
    nproc: PositiveInt = 1
    nodes: PositiveInt = 1     # slurm: SLURM_NNODES (recorded as parallel.nodes); local: 1
    threads_per_rank: Optional[PositiveInt] = None
    monitor_interval_s: Annotated[float, Field(gt=0, le=5)] = 0.25
    # local launcher: how the agent starts ranks. auto = fork on CPU (ranks inherit the
    # launcher's imports), spawn on CUDA (a forked child cannot use a driver its parent touched)
    start_method: Literal["auto", "fork", "spawn"] = "auto"
    # local launcher: torch's elastic agent restarts every rank after a failure this many times
    # (torchrun --max-restarts); a restarted attempt resumes from the newest complete save of
    # run.checkpoint, and the record's `recovery` says what the failure cost (ddlbench/metrics/recovery.py)
    max_restarts: NonNegativeInt = 0


class LoggerCfg(Strict):
    name: Literal["wandb", "none"]
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "ddlbench"
    entity: Optional[str] = None
    init_timeout_s: Annotated[float, Field(gt=0)] = 30


class PeakFlops(Strict):
    fp32: Annotated[float, Field(gt=0)]
    tf32: Annotated[float, Field(gt=0)]
    bf16: Annotated[float, Field(gt=0)]
    fp16: Annotated[float, Field(gt=0)]
    hbm: Optional[Annotated[float, Field(gt=0)]] = None     # the memory's datasheet bandwidth, bytes/s


class HardwareCfg(Strict):
    name: str
    peak_flops: Optional[PeakFlops] = None
    gpu_table: dict[str, PeakFlops] = {}


class CheckpointCfg(Strict):
    """run.checkpoint: the run saves its training state every `every` measured steps, the framework's
    recommended way (its Variant's abilities().checkpoints: the modes it offers); ddlbench/rank/saves.py."""
    every: NonNegativeInt = 0                   # measured steps between saves; 0: none
    # async: the write goes on in a thread while training does; async_process: in a background process
    # (DCP's AsyncCheckpointerType.PROCESS: the rank stages the state, the process writes it)
    # async_pinned (CUDA): the thread's write staged through pinned host buffers (torchtitan's async_with_pinned_mem)
    mode: Literal["sync", "async", "async_process", "async_pinned"] = "sync"
    dir: Optional[str] = None                   # null: <run dir>/checkpoints
    keep: PositiveInt = 1                       # the newest saves left on disk
    resume_from: Optional[str] = None           # a save's directory (<dir>/step_<N>): the run starts from it,
                                                # at step N of the same data stream, the load timed by phase


class RunCfg(Strict):
    warmup_steps: NonNegativeInt = 3
    # set: warm-up goes on past warmup_steps until the step times settle, at most this many steps
    # (ddlbench/metrics/warmup.py; timing.warmup_rule says where it ended and why)
    warmup_max_steps: Optional[PositiveInt] = None
    measure_steps: PositiveInt = 10
    # a time-based window: at least this many seconds of measured steps (more than measure_steps where
    # the steps are short), from the last warm-up step's time agreed over ranks (ddlbench/metrics/window.py)
    min_window_s: Optional[Annotated[float, Field(gt=0)]] = None
    global_batch: PositiveInt = 8
    # null: the framework's default (grad_accum 1, or the pipeline's micro-batches); auto: the largest
    # the memory estimator says fits the device (ddlbench/planning/microbatch.py)
    micro_batch: Optional[Union[PositiveInt, Literal["auto"]]] = None
    device_memory_gb: Optional[Annotated[float, Field(gt=0)]] = None   # emulate a smaller device (auto sizes to it)
    seed: NonNegativeInt = 0
    # auto: ddlbench.machine.device.auto_precision; fp8: bf16 with float8 matmuls (run.float8), below
    precision: Literal[("auto",) + PRECISIONS + ("fp8",)] = "auto"  # type: ignore[valid-type]
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: Annotated[float, Field(gt=0)] = 900
    pg_timeout_s: Annotated[float, Field(gt=0)] = 300
    form_timeout_s: Annotated[float, Field(gt=0)] = 120
    form_retries: NonNegativeInt = 1
    dry_run: bool = False
    epochs: Optional[PositiveInt] = None       # set: train whole epochs and evaluate (quality mode)
    eval_every: Optional[PositiveInt] = None   # steps between evaluations; null = each epoch end
    target: Optional[float] = None             # quality target for time/epochs-to-target
    target_metric: Literal["loss", "accuracy"] = "loss"   # validation loss (<=) or accuracy (>=)
    target_vs_floor: bool = False              # loss target = target x the dataset's known floor
    stop_at_target: bool = False
    repeat: NonNegativeInt = 0                 # repeat index: repeats of one cell differ only here
    progress: bool = True
    final_objective: bool = False     # after training: mean loss over the whole training split
                                      # + weight_decay/2 x sum of decayed parameters squared
    comm_profile: bool = True         # more untimed steps under torch.profiler: comm time, overlap
    comm_profile_repeats: PositiveInt = 3   # how many probe periods it profiles (their spread is recorded)
    memory_tracker: bool = False      # every step under torch's MemTracker: memory.tracker per rank (slow)
    param_fingerprint: bool = False   # record [sum, sum^2, sum |x|, position-weighted sum] per final parameter (gathers!)
    compile: bool = False             # torch.compile, applied as each framework recommends (adapters/parallelize.py)
    trace: bool = False               # one more step after the window under torch.profiler: trace-rank{r}.json/.txt
    gc: Literal["freeze", "python", "torchtitan"] = "freeze"   # what the cyclic GC may do in a step (ddlbench/rank/gcpolicy.py)
    gc_every: PositiveInt = 50        # run.gc=torchtitan: steps between its generation-1 collections (its gc_freq)
    step_split: bool = False          # each measured step split into forward / backward / optimizer (hooks,
                                      # CUDA events on a GPU): timing.step_split (ddlbench/metrics/step_split.py)
    float8: bool = False              # float8 matmuls in the model's linear layers (torchao Float8Linear, tensorwise
                                      # dynamic scaling, as torchtitan's float8 converter), bf16 around them
    checkpoint: CheckpointCfg = Field(default_factory=CheckpointCfg)
    dir: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def _fp8_is_bf16_with_float8_matmuls(cls, data):
        """run.precision=fp8 is torchtitan's float8 recipe: bf16 around float8 linear layers."""
        if isinstance(data, dict) and data.get("precision") == "fp8":
            return {**data, "precision": "bf16", "float8": True}
        return data

    @model_validator(mode="after")
    def _warm_up_needs(self):
        if self.compile and self.warmup_steps < 1:
            raise ValueError("run.compile needs run.warmup_steps >= 1: the first step compiles, and it must "
                             "not be measured")
        if self.min_window_s is not None and self.epochs:
            raise ValueError("run.min_window_s sizes the measured window of a throughput run; run.epochs (quality "
                             "mode) trains whole epochs: set one of them")
        if self.min_window_s is not None and self.warmup_steps < 1:
            raise ValueError("run.min_window_s needs run.warmup_steps >= 1: the window's length is sized from the "
                             "last warm-up step's time")
        if self.warmup_max_steps is not None and self.epochs:
            raise ValueError("run.warmup_max_steps ends the warm-up of a throughput run when its steps settle; "
                             "run.epochs (quality mode) trains whole epochs: set one of them")
        if self.warmup_max_steps is not None and not 1 <= self.warmup_steps < self.warmup_max_steps:
            raise ValueError(f"run.warmup_max_steps={self.warmup_max_steps} needs 1 <= run.warmup_steps "
                             f"(now {self.warmup_steps}) < run.warmup_max_steps: warm-up runs at least "
                             "warmup_steps, then until the steps settle, at most warmup_max_steps")
        if self.min_window_s is not None and self.min_window_s >= self.timeout_s:
            raise ValueError(f"run.min_window_s={self.min_window_s:g} s cannot fit in run.timeout_s={self.timeout_s:g} s "
                             "(the run would end at its timeout with nothing measured): raise run.timeout_s or "
                             "shorten the window")
        return self


class FaultCfg(Strict):
    kind: Literal["none", "raise", "kill", "hang", "sleep", "jitter", "hang_at_start"] = "none"
    rank: NonNegativeInt = 0
    step: NonNegativeInt = 0
    seconds: Annotated[float, Field(ge=0)] = 0.0


class BenchCfg(Strict):
    framework: FrameworkCfg
    model: ModelCfg
    data: DataCfg
    optim: OptimCfg
    launcher: LauncherCfg
    logger: LoggerCfg
    hardware: HardwareCfg
    run: RunCfg
    fault: FaultCfg = FaultCfg()
