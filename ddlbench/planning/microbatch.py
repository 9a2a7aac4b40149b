"""`run.micro_batch=auto`: the largest micro-batch the memory estimator says fits the device, the
global batch kept by gradient accumulation (ddlbench/estimate/memory.py, the estimate `bench advise`
prunes by; docs/memory-check.md holds it within 10% of torch's MemTracker on every strategy).

The device's memory: `run.device_memory_gb` (emulating a smaller device: on CUDA the rank caps its
allocator at it, ddlbench/machine/device.py), else the smallest visible GPU's, else (CPU) the host's memory
shared by the ranks of this machine. A candidate fits when its estimated peak on the busiest rank
is at most (1 - HEADROOM) of it. Chosen at validation, before anything launches; result.json's
`parallel.micro_batch_auto` says what was chosen and why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ddlbench.errors import ConfigError

GiB = 1 << 30
# the estimator's measured error is within 10% (docs/memory-check.md): leave that much unplanned
HEADROOM = 0.10


def divisors_descending(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def pick(estimates: list[tuple[int, int]], limit_bytes: int, headroom: float = HEADROOM) -> tuple[int, str]:
    """(micro_batch, why) from [(micro_batch, estimated bytes)] in descending micro-batch: the
    largest that fits (1 - headroom) x limit; none fitting, the smallest (the run then shows the OOM)."""
    if not estimates:
        raise ConfigError("run.micro_batch=auto: no micro-batch divides the local batch")
    budget = (1.0 - headroom) * limit_bytes
    for mb, need in estimates:
        if need <= budget:
            return mb, (f"the largest micro-batch whose estimated peak ({need / GiB:.2f} GiB) fits "
                        f"{1 - headroom:.0%} of {limit_bytes / GiB:.2f} GiB")
    mb, need = estimates[-1]
    return mb, (f"none fits: the smallest ({mb}) needs {need / GiB:.2f} GiB by the estimate, more than "
                f"{1 - headroom:.0%} of {limit_bytes / GiB:.2f} GiB; running it shows what the device says")


def device_limit(run_cfg, device: str, ranks_here: int) -> tuple[int, str]:
    """The memory one device offers, and where that figure comes from."""
    if run_cfg.device_memory_gb is not None:
        return int(run_cfg.device_memory_gb * GiB), "run.device_memory_gb"
    if device == "cuda":
        from ddlbench.machine.gpus import visible_gpus
        info = visible_gpus()
        return info.min_memory, f"the smallest visible GPU ({info.source})"
    total = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:")), 0)
    return total // max(1, ranks_here), f"host MemTotal / {ranks_here} ranks on this machine"


def choose(plan_for, cfg, device: str) -> tuple[int, dict]:
    """`plan_for(micro_batch)` -> a validated Plan at that micro-batch (ConfigError where it cannot
    be); returns (micro_batch, the record of the choice)."""
    from ddlbench.estimate.memcheck import predicted
    from ddlbench.estimate.profile import cached_profile

    prof, prof_source = cached_profile(cfg.model, cfg.run.precision, device)
    ranks_here = cfg.launcher.nproc if cfg.launcher.name == "local" else max(1, cfg.launcher.nproc // cfg.launcher.nodes)
    limit, source = device_limit(cfg.run, device, ranks_here)
    estimates = []
    for mb in divisors_descending(cfg.run.global_batch):
        try:
            plan = plan_for(mb)
        except ConfigError:          # does not divide the local batch, or the pipeline's micro-batches
            continue
        try:
            estimates.append((mb, int(predicted(plan, prof, device=device)["total"])))
        except ValueError as exc:      # no cost model: nothing to size by
            raise ConfigError(f"run.micro_batch=auto: {exc}") from None
    mb, why = pick(estimates, limit)
    fits = any(need <= (1.0 - HEADROOM) * limit for _, need in estimates)
    return mb, {"chosen": mb, "fits": fits, "why": why, "device_memory_bytes": limit, "device_memory_source": source,
                "headroom": HEADROOM, "estimates_bytes": {str(m): b for m, b in estimates},
                "estimator": "ddlbench/estimate/memory.py (the variant's cost model, the model's meta-device profile)",
                "profile_source": prof_source}


def nothing_fits_warning(choices: dict) -> Optional[str]:
    """The warning a run prints and records when run.micro_batch=auto found no micro-batch that fits."""
    auto = choices.get("micro_batch_auto") or {}
    if auto.get("fits", True):
        return None
    return f"run.micro_batch=auto: no micro-batch fits the device; running micro-batch {auto['chosen']} ({auto['why']})"


def memory_fraction(cap_bytes: Optional[int], total_bytes: int) -> Optional[float]:
    """The fraction of a GPU's memory a rank may allocate under run.device_memory_gb (None: no cap)."""
    if cap_bytes is None or total_bytes <= 0:
        return None
    if cap_bytes > total_bytes:
        raise ConfigError(f"run.device_memory_gb {cap_bytes / GiB:.1f} exceeds the GPU's {total_bytes / GiB:.1f} GiB")
    return cap_bytes / total_bytes
