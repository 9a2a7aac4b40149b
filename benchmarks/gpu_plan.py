"""The GPU plan: what a session lent a GPU runs first, unattended, in steps that each fit one
device call with margin, in the order of what has never run on a GPU. On the lent machine (no
network, the wheels carried):

    run(carry=[".whl"], timeout_s=WORST, command="bash scripts/device_gpu_matrix.sh G --plan G")
    python benchmarks/gpu_plan.py                                # here: cells validated, the leases planned

Each step is benchmarks/gpu_matrix.py with the step's cells, deadline and reference-loop runs. What
makes it safe to run unattended (tests/test_gpu_plan.py holds each):
- as each cell ends its record is appended to $OUT/STEP.records.jsonl and the rows to
  $OUT/STEP.checks.json (gpu_matrix --keep): a call stopped at its limit returns what it finished;
- a cell's harness kill is its own run.timeout_s + RECORD_GRACE_S (a timed-out run still writes its
  record inside it);
- a step's worst case (`worst_case_s`: the install, the probes, the deadline, the slowest cell's
  kill, the reference-loop runs at their measured length, each projection's timeout) stays
  CALL_MARGIN_S under the tool's 10-minute limit, and is the call's timeout_s;
- `leases(ORDER)` packs the steps into 15-minute leases, the machine's start included; the next
  lease holds the first of them.

Steps, in ORDER (what has never run on a GPU first; a step a lease cannot reach waits for the next):
  K  checkpoints (issue 67): llama_1b's FSDP2 saves sync, async in a thread, in DCP's process and
     staged through pinned host buffers, and DDP's restart after its rank is killed:
     the restart's relaunch, CUDA start and read of the save, against the CPU figures
  P  the pieces calibration: llama_8b's embedding, blocks (1 and 5 of its 32), head and optimizer
     timed on the GPU, FSDP2's own step at 8 ranks over a fake process group, for `bench project
     calibrate=pieces` at torchtitan's setting (issue 50) (ran 2026-11-30 with A's GPT-2 fast-path
     cell: the pieces and the cell; the framework's step ran out of memory: its model was built for
     the CPU, eager attention; fixed since, not yet run on a GPU)
  O  llama_3b's offload variants in 40 GB at 1 + 4 steps (at 3 + 20 steps they ran past 120 s)
  A  the harness: a profiled step (run.trace), forward / backward / optimizer by CUDA events
     (run.step_split) on gpt2_small and llama_1b, the reference loop against the runner on
     gpt2_small at micro-batch 32, eager and compiled (ran: reports/gpu-h200/2026-11-26, -27)
  B  every framework that runs on one GPU, on llama_1b at bf16 with run.micro_batch=auto, DDP
     twice, FSDP2 compiled with float8 matmuls (ran: reports/gpu-h200/2026-11-26)
  C  llama_1b at micro-batch 2 with `sdpa` and `sdpa_causal`; llama_3b in 40 GB (FSDP2 ends OOM
     with its reason); ResNet-50 at batch 128 with each batch-norm recipe (ran: 2026-11-27)
  M  Mixture of Experts on one GPU, reduced-depth published shapes (Qwen3-30B-A3B 4 of 48 layers,
     Mixtral 8x7B 2 of 32): grouped_mm against the per-expert loop; DDP, FSDP2, ZeRO-2, EP=1,
     DeepSpeed-MoE at ep_size=1 (ran: 2026-11-27)
  L  long context: llama_1b at 8k -> 32k tokens under checkpointing none, selective_op and full
     (ran: 2026-11-27)
  G  the garbage-collector fix: the FSDP2 cells whose windows held a full collection
     (reports/gpu-h200/2026-11-27) under run.gc=freeze beside run.gc=python, each window 10 s or
     more (ran: 2026-11-30)
Run here, it validates each cell's configuration (`bench run ... run.dry_run=true run.device=cpu`,
in-process), prints each step's device call with its worst case and the leases; the suite runs it.
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
FAST_PATH = "ddp gpt2_small bf16 model.activation=gelu_new model.pad_vocab_to=1 optim.impl=foreach run.timeout_s=60"

# the budget of a call and a lease (seconds), from the H200 sessions of 2026-11-26/27
CALL_LIMIT_S = 600      # the device tool's limit on one command
CALL_MARGIN_S = 60      # a step's worst case stays this far under it
LEASE_S = 900           # device time a session is lent, the machine's start and give-back included
START_S = 100           # outside the calls: 54 s and 65 s of the two leases of 2026-11-27
INSTALL_S = 60          # the carried wheels and DeepSpeed's build there: 18-30 s
PROBE_S = 30            # the matmul probes gpu_matrix always runs: three host-timed dtypes, three CUDA-event shapes
# one reference-loop or runner run of benchmarks/runner_overhead.py there, start-up included: gpt2_small ~22 s at
# batch 32 (reports/gpu-h200/2026-11-26); llama_1b as long as one of its cells (34-42 s in step B). Not a kill:
# a reference run past these is cut by the call's timeout_s, the records of the cells before it kept
RUN_S = {"gpt2_small": 25, "llama_1b": 40}
# issue 50's per-piece compute: llama_8b's embedding, blocks (at 1 and 5 of its 32) and head timed on the GPU at
# torchtitan's published setting (local batch 2, 8192 tokens, selective AC), projected to 8 / 128 / 1,024 H200s
LLAMA8B_PIECES = ("model=llama_8b framework=fsdp_full network=dgx_h100 hardware=H200 run.precision=bf16 "
                  "model.seq_len=8192 local_batch=2 run.micro_batch=2 ac=selective_op calibrate=pieces "
                  "world_sizes=[8,128,1024] device_memory_gb=141")
# step G's windows: at least 10 s of steps (about twice the 20 steps at these shapes), so each record's
# timing.window_vs_median.slowest_step_moves says whether one outlier still moves the figure by 1% or more
GC_WINDOW = "run.min_window_s=10 run.timeout_s=80"
# llama_1b saving every 3 measured steps (2 saves of ~15 GB: fp32 parameters and AdamW's two moments), one kept
CKPT = ("llama_1b bf16 run.micro_batch=auto run.warmup_steps=2 run.measure_steps=6 run.checkpoint.every=3 "
        "run.timeout_s=150")
LONG = "llama_1b bf16 run.global_batch=1 run.micro_batch=1 framework.options.activation_checkpointing"


@dataclass(frozen=True)
class Step:
    what: str
    cells: tuple[str, ...]                      # gpu_matrix --cell specs: 'FRAMEWORK MODEL PRECISION key=value ...'
    deadline_s: int                             # no cell starts after this (gpu_matrix --deadline)
    overhead: tuple[str, ...] = ()              # gpu_matrix --overhead specs: 'MODEL PRECISION BATCH [compile] [repeats=N]'
    args: tuple[str, ...] = field(default=())   # more gpu_matrix arguments
    project: tuple[str, ...] = ()               # gpu_matrix --project specs: `bench project` key=value ...
    timeout_s: int = 120                        # run.timeout_s of a cell that gives none
    project_timeout_s: int = 200                # each --project run's

    def matrix_args(self) -> list[str]:
        # no cells: projections only (gpu_matrix's `report` part has no runs to report then)
        parts = "cells,overhead" if self.overhead else "cells" if self.cells else "report"
        out = ["--parts", parts, "--steps", "20", "--timeout", str(self.timeout_s), "--deadline", str(self.deadline_s),
               "--project-timeout", str(self.project_timeout_s), *self.args]
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
        deadline_s=300),
    "L": Step("long context on one GPU: llama_1b at 8k, 16k and 32k tokens under activation checkpointing "
              "none, selective_op (torchtitan's per-op policy) and full; what fits and its tokens/s", (
        f"fsdp_full {LONG}=none model.seq_len=8192", f"fsdp_full {LONG}=selective_op model.seq_len=8192",
        f"fsdp_full {LONG}=full model.seq_len=8192", f"fsdp_full {LONG}=none model.seq_len=16384",
        f"fsdp_full {LONG}=selective_op model.seq_len=16384", f"fsdp_full {LONG}=full model.seq_len=16384",
        f"fsdp_full {LONG}=selective_op model.seq_len=32768", f"fsdp_full {LONG}=full model.seq_len=32768"),
        deadline_s=300),
    "A": Step("the harness against a reference loop; where a step's time goes", (
        "ddp gpt2_small bf16 run.trace=true",
        f"ddp {GPT2} run.step_split=true", f"fsdp_full {LLAMA} run.step_split=true"), deadline_s=60,
        overhead=("gpt2_small bf16 32 repeats=2", "gpt2_small bf16 32 compile repeats=2")),
    "B": Step("every framework that runs on one GPU, llama_1b bf16, micro_batch=auto", (
        f"ddp {LLAMA}", f"fsdp_full {LLAMA}", f"fsdp_full {LLAMA} run.compile=true run.float8=true",
        f"deepspeed_zero3 {LLAMA}", f"fsdp_grad_op {LLAMA}",
        f"deepspeed_zero2 {LLAMA}", f"ddp {LLAMA} run.repeat=1", f"deepspeed_zero1 {LLAMA}",
        f"fsdp_hybrid {LLAMA}", f"deepspeed_zero0 {LLAMA}", f"ddp_bf16_hook {LLAMA}", f"fsdp_offload {LLAMA}",
        f"deepspeed_zero3_offload {LLAMA}"), deadline_s=300),
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
        deadline_s=300),
    "G": Step("the collector frozen (run.gc=freeze) against Python's thresholds in the FSDP2 windows that held a "
              "full collection, each window 10 s or more", (
        f"fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa {GC_WINDOW}",
        f"fsdp_full llama_1b bf16 run.micro_batch=2 model.attention=sdpa {GC_WINDOW} run.gc=python",
        f"fsdp_full resnet50 bf16 run.global_batch=128 {GC_WINDOW}",
        f"fsdp_full resnet50 bf16 run.global_batch=128 {GC_WINDOW} run.gc=python"), deadline_s=190),
    "P": Step("llama_8b's pieces timed on the GPU for bench project calibrate=pieces, and FSDP2's own step over a "
              "fake group (its model built for the GPU since the out-of-memory of 2026-11-30)",
              (), deadline_s=0, project=(LLAMA8B_PIECES,), project_timeout_s=200),
    "K": Step("checkpoints on a GPU: llama_1b's FSDP2 saves sync, async (a thread), async_process (DCP's "
              "process) and async_pinned (staged through pinned host buffers); a killed rank's restart from its save", (
        f"fsdp_full {CKPT} run.checkpoint.mode=sync", f"fsdp_full {CKPT} run.checkpoint.mode=async",
        f"fsdp_full {CKPT} run.checkpoint.mode=async_process", f"fsdp_full {CKPT} run.checkpoint.mode=async_pinned",
        f"ddp {CKPT} launcher.max_restarts=1 fault.kind=kill fault.rank=0 fault.step=7"), deadline_s=180),
    "O": Step("llama_3b's offload variants in 40 GB, 1 + 4 steps", (
        f"fsdp_offload {OFFLOAD}", f"deepspeed_zero3_offload {OFFLOAD}"), deadline_s=100),
}


ORDER = ("K", "P", "O", "A", "B", "C", "M", "L", "G")


def worst_case_s(step: Step) -> float:
    """The longest a step's call can take: the install and probes, cells started until the deadline,
    the last one running to its kill (its run.timeout_s + gpu_matrix.RECORD_GRACE_S), the
    reference-loop runs (two per repeat) at their measured length, each projection to its timeout."""
    from gpu_matrix import cell_kill_s
    kill = max((cell_kill_s([f"run.timeout_s={step.timeout_s}", *cell_overrides(c)]) for c in step.cells), default=0)
    overhead = sum(2 * _repeats(o) * RUN_S[o.split()[0]] for o in step.overhead)
    return INSTALL_S + PROBE_S + step.deadline_s + kill + overhead + step.project_timeout_s * len(step.project)


def _repeats(spec: str) -> int:
    return int(next((f.split("=")[1] for f in spec.split() if f.startswith("repeats=")), 3))


def leases(order=ORDER, steps=None) -> list[list[str]]:
    """The steps packed, in order, into leases of LEASE_S: a lease takes the next step while its
    machine start and the worst cases of its steps fit."""
    steps = steps or STEPS
    out, used = [], LEASE_S
    for name in order:
        need = worst_case_s(steps[name])
        if used + need > LEASE_S:
            out.append([])
            used = START_S
        out[-1].append(name)
        used += need
    return out


def settings_added_since(recorded_run: dict) -> dict:
    """The run settings a committed GPU record's config.run lacks (added since it ran), with their
    defaults now: what a new figure compared with that record ran under and it did not. Settings
    whose default is off (None, False) change nothing and are left out."""
    from ddlbench.settings.schema import RunCfg
    return {k: v for k, v in RunCfg().model_dump().items() if k not in recorded_run and v not in (None, False)}


def _latest_record() -> tuple[Path, dict] | None:
    found = sorted(REPO.glob("reports/gpu-*/*/*/runs/*/result.json"), key=lambda p: p.parts[-5])
    if not found:
        return None
    import json
    return found[-1], json.loads(found[-1].read_text())["config"]["run"]


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
        print(f"  device call (worst case {worst_case_s(step):.0f} s): run(carry=['.whl'], "
              f"timeout_s={worst_case_s(step):.0f}, command='bash scripts/device_gpu_matrix.sh {name} --plan {name}')")
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
    bad = dry([a.step] if a.step else list(ORDER))
    latest = _latest_record()
    if latest:
        added = settings_added_since(latest[1])
        print(f"run settings the committed GPU records lack ({'/'.join(latest[0].relative_to(REPO).parts[:3])}), now: "
              + (", ".join(f"run.{k}={v}" for k, v in added.items()) or "none"))
    for n, lease in enumerate(leases(), 1):
        total = START_S + sum(worst_case_s(STEPS[s]) for s in lease)
        print(f"lease {n}: steps {', '.join(lease)} (worst case {total:.0f} s of {LEASE_S}, start included)")
    return int(bool(bad))


if __name__ == "__main__":
    sys.exit(main())
