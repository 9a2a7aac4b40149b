"""The GPU plan: what a session lent a GPU runs first, unattended, in steps that each fit one
device call (under 10 minutes: the deadline, the last cell's timeout and the install). A session's
15 device-minutes hold one step and most of the next (the machine's start included; the deadline
lists what a step did not reach as not_run). Each step is benchmarks/gpu_matrix.py with the step's cells, deadline
and reference-loop runs; on the lent machine (no network, the wheels carried):

    run(carry=[".whl"], command="bash scripts/device_gpu_matrix.sh A --plan A")   # one step, into $OUT
    python benchmarks/gpu_plan.py                                # here: every cell validated on CPU

Steps (the order the next session runs them is at the end; a step a session cannot reach waits for the next):
  M  Mixture of Experts on one GPU, a reduced-depth published shape (Qwen3-30B-A3B's layers, 4 of
     its 48; Mixtral 8x7B's, 2 of 32): transformers' grouped_mm against the per-expert loop under
     DDP, FSDP2 and DeepSpeed ZeRO-2 over the whole MoE model, the expert-parallel adapter at ep=1
     (its code path without the all-to-all) and DeepSpeed-MoE at ep_size=1; ran on one H200
     (reports/gpu-h200/2026-11-27/)
  L  long context on one GPU: llama_1b at 8k -> 32k tokens under activation checkpointing none,
     selective_op and full (what fits, tokens/s; the estimator's saved bytes per policy against the
     device); ran on one H200 (reports/gpu-h200/2026-11-27/)
  A  the harness: the bf16 matmul peak (CUDA events, three shapes); the reference loop against the
     runner on gpt2_small at micro-batch 32, eager and compiled, and on llama_1b at 8; the fast-path
     cells, one of them with a profiled step (run.trace: a Chrome trace per rank); forward /
     backward / optimizer by CUDA events (run.step_split) on gpt2_small and llama_1b
  B  the frameworks: every framework that runs on one GPU, on llama_1b at bf16 with
     run.micro_batch=auto, DDP twice (its repeat says how far one run is from the next), and FSDP2
     compiled with float8 matmuls (torchtitan's fastest published recipe)
  C  memory-bound: llama_3b under run.device_memory_gb=40 (FSDP2 without offload ends OOM with its
     reason, the offload variants run; llama_8b's offloaded state, ~128 GB, would fill the machine's
     128 GiB of host memory) and ResNet-50 at batch 128 with each batch-norm recipe; first,
     llama_1b at micro-batch 2 (4 accumulated) with `sdpa` (a host sync per forward) and
     `sdpa_causal` (none)
  G  first next time: the garbage-collector fix on a GPU (the FSDP2 cells whose windows held a full
     collection, now under run.gc=freeze, beside run.gc=python, in windows of at least 10 s:
     run.min_window_s), C's two offload cells with fewer
     steps (at 3 + 20 steps they ran past 120 s), A's fast-path cell the deadline left, and
     llama_8b's pieces and optimizer timed on the GPU, with FSDP2's own step at 8 ranks over a fake
     process group, for `bench project calibrate=pieces` (issue 50)
Run so far: A (without its llama_1b and run.step_split parts) and B on one H200
(reports/gpu-h200/2026-11-26/); M, L, C (its offload cells timed out) and A's llama_1b parts on one
H200 (reports/gpu-h200/2026-11-27/). The next session starts with G, then A.
Run here, it validates each cell's configuration (`bench run ... run.dry_run=true run.device=cpu`,
in-process) and prints the device commands; the suite runs it (tests/test_gpu_plan.py).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA = "llama_1b bf16 run.micro_batch=auto"
GPT2 = "gpt2_small bf16 run.global_batch=32 run.micro_batch=auto"
# Qwen3-30B-A3B's layer shapes (128 experts of 768, top-8, hidden 2048), 4 layers: ~3.1B parameters
QMOE = "qwen3_moe_30b_a3b bf16 model.n_layer=4 model.seq_len=2048 run.global_batch=4 run.micro_batch=2"
# llama_3b offloaded in a 40 GB cap: > 3.9 s a step (FSDP2) and DeepSpeed's CPU Adam compiled at first use
OFFLOAD = ("llama_3b bf16 run.device_memory_gb=40 run.global_batch=4 run.micro_batch=1 run.warmup_steps=1 "
           "run.measure_steps=4 run.timeout_s=170")
# issue 50's per-piece compute: llama_8b's embedding, blocks (at 1 and 5 of its 32) and head timed on the GPU at
# torchtitan's published setting (local batch 2, 8192 tokens, selective AC), projected to 8 / 128 / 1,024 H200s
LLAMA8B_PIECES = ("model=llama_8b framework=fsdp_full network=dgx_h100 hardware=H200 run.precision=bf16 "
                  "model.seq_len=8192 local_batch=2 run.micro_batch=2 ac=selective_op calibrate=pieces "
                  "world_sizes=[8,128,1024] device_memory_gb=141")
# step G's windows: at least 10 s of steps (about twice the 20 steps at these shapes), so each record's
# timing.window_vs_median.slowest_step_moves says whether one outlier still moves the figure by 1% or more
GC_WINDOW = "run.min_window_s=10"
LONG = "llama_1b bf16 run.global_batch=1 run.micro_batch=1 framework.options.activation_checkpointing"


@dataclass(frozen=True)
class Step:
    what: str
    cells: tuple[str, ...]                      # gpu_matrix --cell specs: 'FRAMEWORK MODEL PRECISION key=value ...'
    deadline_s: int                             # no cell starts after this (gpu_matrix --deadline)
    overhead: tuple[str, ...] = ()              # gpu_matrix --overhead specs: 'MODEL PRECISION BATCH [compile] [repeats=N]'
    args: tuple[str, ...] = field(default=())   # more gpu_matrix arguments
    project: tuple[str, ...] = ()               # gpu_matrix --project specs: `bench project` key=value ...

    def matrix_args(self) -> list[str]:
        parts = "cells,overhead" if self.overhead else "cells"
        out = ["--parts", parts, "--steps", "20", "--timeout", "120", "--deadline", str(self.deadline_s), *self.args]
        for c in self.cells:
            out += ["--cell", c]
        for o in self.overhead:
            out += ["--overhead", o]
        for p in self.project:
            out += ["--project", p]
        return out


STEPS = {
    "M": Step("Mixture of Experts on one GPU: grouped_mm against the per-expert loop; DDP, FSDP2, ZeRO-2, EP=1, "
              "DeepSpeed-MoE", (
        f"ddp {QMOE} model.moe.experts_implementation=grouped_mm",
        f"ddp {QMOE} model.moe.experts_implementation=eager",
        f"fsdp_full {QMOE}",
        f"expert_parallel {QMOE} framework.options.ep=1",
        f"deepspeed_zero2 {QMOE}",
        f"deepspeed_moe {QMOE} framework.options.ep_size=1",
        "ddp mixtral_8x7b bf16 model.n_layer=2 model.seq_len=2048 run.global_batch=2 run.micro_batch=1"),
        deadline_s=350),
    "L": Step("long context on one GPU: llama_1b at 8k, 16k and 32k tokens under activation checkpointing "
              "none, selective_op (torchtitan's per-op policy) and full; what fits and its tokens/s", (
        f"fsdp_full {LONG}=none model.seq_len=8192", f"fsdp_full {LONG}=selective_op model.seq_len=8192",
        f"fsdp_full {LONG}=full model.seq_len=8192", f"fsdp_full {LONG}=none model.seq_len=16384",
        f"fsdp_full {LONG}=selective_op model.seq_len=16384", f"fsdp_full {LONG}=full model.seq_len=16384",
        f"fsdp_full {LONG}=selective_op model.seq_len=32768", f"fsdp_full {LONG}=full model.seq_len=32768"),
        deadline_s=350),
    "A": Step("the harness against a reference loop; the fast path against the old one; where a step's time goes", (
        "ddp gpt2_small bf16 model.activation=gelu_new model.pad_vocab_to=1 optim.impl=foreach",
        "ddp gpt2_small bf16 run.trace=true",
        f"ddp {GPT2} run.step_split=true", f"fsdp_full {LLAMA} run.step_split=true"), deadline_s=80,
        overhead=("gpt2_small bf16 32 repeats=2", "gpt2_small bf16 32 compile repeats=2", "llama_1b bf16 8 repeats=1")),
    "B": Step("every framework that runs on one GPU, llama_1b bf16, micro_batch=auto", (
        f"ddp {LLAMA}", f"fsdp_full {LLAMA}", f"fsdp_full {LLAMA} run.compile=true run.float8=true",
        f"deepspeed_zero3 {LLAMA}", f"fsdp_grad_op {LLAMA}",
        f"deepspeed_zero2 {LLAMA}", f"ddp {LLAMA} run.repeat=1", f"deepspeed_zero1 {LLAMA}",
        f"fsdp_hybrid {LLAMA}", f"deepspeed_zero0 {LLAMA}", f"ddp_bf16_hook {LLAMA}", f"fsdp_offload {LLAMA}",
        f"deepspeed_zero3_offload {LLAMA}"), deadline_s=350),
    "C": Step("memory-bound: llama_3b in 40 GB; ResNet-50 batch 128 with each batch-norm recipe; "
              "what transformers' host sync per forward costs under gradient accumulation", (
        "fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa",
        "fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa_causal",
        "fsdp_full llama_3b bf16 run.device_memory_gb=40 run.global_batch=4 run.micro_batch=1",
        "fsdp_offload llama_3b bf16 run.device_memory_gb=40 run.global_batch=4 run.micro_batch=1",
        "deepspeed_zero3_offload llama_3b bf16 run.device_memory_gb=40 run.global_batch=4 run.micro_batch=1",
        "ddp resnet50 bf16 run.global_batch=128",
        "fsdp_full resnet50 bf16 run.global_batch=128",
        "fsdp_full resnet50 bf16 run.global_batch=128 framework.options.batch_norm_units=per_layer"),
        deadline_s=350),
    "G": Step("the collector frozen (run.gc=freeze) against Python's thresholds in the FSDP2 windows that held a "
              "full collection; llama_3b's offload variants in 40 GB, 1 + 4 steps; A's fast-path cell", (
        f"fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa {GC_WINDOW}",
        f"fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa {GC_WINDOW} run.gc=python",
        f"fsdp_full resnet50 bf16 run.global_batch=128 {GC_WINDOW}",
        f"fsdp_full resnet50 bf16 run.global_batch=128 {GC_WINDOW} run.gc=python",
        f"fsdp_offload {OFFLOAD}",
        f"deepspeed_zero3_offload {OFFLOAD}",
        "ddp gpt2_small bf16 model.activation=gelu_new model.pad_vocab_to=1 optim.impl=foreach"),
        deadline_s=240, project=(LLAMA8B_PIECES,)),
}


def cell_overrides(spec: str) -> list[str]:
    """A --cell spec as `bench run` overrides."""
    fw, model, prec, *rest = spec.split()
    return [f"framework={fw}", f"model={model}", f"run.precision={prec}", *rest]


def dry(steps: list[str]) -> int:
    """Every cell's configuration validated here (run.device=cpu); run.micro_batch=auto sized
    once per model (the estimator's profile is the slow part; here it sizes to this host, not the
    GPU). The device commands printed. Returns the number of invalid cells."""
    from ddlbench.errors import ConfigError
    from ddlbench.planning.config import plan_from_overrides
    bad, sized = 0, set()
    for name in steps:
        step = STEPS[name]
        print(f"step {name}: {step.what}")
        print(f"  device call: bash scripts/device_gpu_matrix.sh {name} --plan {name}")
        print(f"  runs: python benchmarks/gpu_matrix.py --out OUT {shlex.join(step.matrix_args())}")
        for spec in step.cells:
            overrides = cell_overrides(spec)
            if overrides[1] in sized:
                overrides = [o for o in overrides if o != "run.micro_batch=auto"]
            sized.add(overrides[1])
            try:
                plan = plan_from_overrides([*overrides, "run.device=cpu", "run.dry_run=true"])
                print(f"  ok       {spec}  (dp {plan.dims.dp}, micro-batch {plan.dims.micro_batch})")
            except ConfigError as exc:
                bad += 1
                print(f"  INVALID  {spec}: {exc}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", choices=sorted(STEPS), help="only this step")
    a = ap.parse_args()
    return int(bool(dry([a.step] if a.step else sorted(STEPS))))


if __name__ == "__main__":
    sys.exit(main())
