"""`bench advise`'s options: key=value arguments, their defaults and the limits they imply."""
from __future__ import annotations

import os
from pathlib import Path

from ddlbench.advise.grid import DEFAULT_FRAMEWORKS
from ddlbench.errors import ConfigError

ADVICE = "advice.json"


GiB = 1 << 30


PASS_THROUGH = ("run.", "optim.", "data.", "model.")    # config overrides given to every run


KEYS = {"model", "devices", "global_batch", "micro_batches", "device_memory_gib", "network", "frameworks",
        "budget_runs", "backend", "dir", "verify_pruned", "devices_per_node", "algorithm", "calibrate", "evaluate",
        "repeats", "grid_repeats"}


USAGE = ("usage: bench advise model=PRESET devices=N [global_batch=G] [micro_batches=[1,2,...]] "
         "[device_memory_gib=X] [network=NAME] [frameworks=a,b,...] [budget_runs=K] [backend=local|slurm] "
         "[verify_pruned=K] [devices_per_node=N] [calibrate=frameworks|ddp] [evaluate=none|all [grid_repeats=R]] [repeats=R] [dir=DIR] [run.KEY=VALUE logger=... ...]   |   bench advise resume DIR")


def parse(args: list[str]) -> tuple[dict, list[str]]:
    """(options, run.* overrides passed to every run)."""
    from ddlbench.planning.config import group_options
    from ddlbench.settings.keyvalue import parse_key_values

    kv = parse_key_values(args, "bench advise", KEYS, usage=USAGE, required=("model", "devices"),
                          passes=lambda k: k.startswith(PASS_THROUGH) or k in ("logger", "optim", "data", "experiment"),
                          passes_hint="overrides for every run: run.*, optim.*, data.*, model.*, logger, optim, data, experiment")
    out = {"model": kv.text("model"), "devices": kv.integer("devices"),
           "global_batch": kv.integer("global_batch"), "budget_runs": kv.integer("budget_runs", 3, low=0),
           "verify_pruned": kv.integer("verify_pruned", 0, low=0), "repeats": kv.integer("repeats", 3, low=1),
           "devices_per_node": kv.integer("devices_per_node"),
           "micro_batches": kv.integers("micro_batches"),
           "device_memory_gib": kv.number("device_memory_gib", positive=True),
           "network": kv.text("network", "auto"), "backend": kv.choice("backend", ("local", "slurm"), "local"),
           "frameworks": kv.items("frameworks", default=default_frameworks(kv.text("model"))),
           "dir": kv.text("dir"), "algorithm": kv.text("algorithm", "auto"),
           "calibrate": kv.choice("calibrate", ("ddp", "frameworks"), "frameworks"),
           # evaluate=all: measure every candidate and judge the advice by its regret
           "evaluate": kv.choice("evaluate", ("none", "all"), "none"),
           # evaluate=all: runs of every grid candidate, interleaved (A B C A B C): the regret's interval
           "grid_repeats": kv.integer("grid_repeats", 1, low=1)}
    if out["grid_repeats"] > 1 and out["evaluate"] != "all":
        raise ConfigError("bench advise: grid_repeats measures the grid of evaluate=all again; give evaluate=all too")
    unknown = [f for f in out["frameworks"] if f not in group_options("framework")]
    if unknown:       # any conf/framework variant is priced by its adapter's cost model
        raise ConfigError(f"bench advise: no framework config {', '.join(unknown)} "
                          f"(conf/framework has: {', '.join(group_options('framework'))})")
    return out, list(kv.passed)


def default_frameworks(model: str | None) -> list[str]:
    """The default candidates; for a Mixture-of-Experts model expert parallelism too."""
    from ddlbench.planning.config import plan_from_overrides
    frameworks = list(DEFAULT_FRAMEWORKS)
    try:
        moe = model is not None and plan_from_overrides([f"model={model}"]).cfg.model.kind == "language" \
            and plan_from_overrides([f"model={model}"]).cfg.model.moe is not None
    except ConfigError:      # a bad model: the composition later says why
        moe = False
    return frameworks + ["expert_parallel"] if moe else frameworks


DEFAULT_NETWORK = {"cpu": "local_gloo", "cuda": "dgx_h100"}


def default_network(device: str, environ=os.environ) -> str:
    """network=auto: inside `bench cluster`, the cluster's own description ($DDLBENCH_NETWORK);
    else gloo between processes of this machine on CPU (calibrated here); on GPUs a reference
    H100 NVLink + InfiniBand cluster (conf/network/dgx_h100.yaml) - never the CPU's gloo figures,
    ~100x too slow for NCCL. Measure yours with `bench commbench` (its network.yaml)."""
    return environ.get("DDLBENCH_NETWORK") or DEFAULT_NETWORK[device]


def devices_per_node(given: int | None, device: str, visible_gpus: int, network) -> tuple[int, str]:
    """(devices per node, where it came from): devices_per_node=, else on GPUs the GPUs visible
    on this node, else the network's first dimension."""
    if given:
        return given, "devices_per_node"
    if device == "cuda" and visible_gpus > 0:
        return visible_gpus, "GPUs visible on this node"
    return network.dims[0].size, f"network {network.name}"


def device_memory_bytes(opts: dict, device: str) -> tuple[int, str]:
    """The memory one device offers: device_memory_gib, else the GPU's, else (CPU) the host's
    memory divided by the devices sharing it."""
    if opts["device_memory_gib"] is not None:
        return int(opts["device_memory_gib"] * GiB), "device_memory_gib"
    if device == "cuda":     # NVML, not CUDA: the calibration and measurement cells are forked from here
        from ddlbench.machine.gpus import visible_gpus
        info = visible_gpus()
        return info.min_memory, f"the smallest visible GPU ({info.source})"
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    return total // opts["devices"], f"host MemTotal / {opts['devices']} devices"
