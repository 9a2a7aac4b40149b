"""Environment capture through an allowlist: versions, host, device, git, threads. Never the
whole environment (secrets live there)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

# OMP_WAIT_POLICY / GOMP_SPINCOUNT: whether idle OpenMP threads spin; on a CPU shared with other work a
# spinning 2-thread rank ran 10x slower (docs/setup.md)
ENV_ALLOWLIST = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS",
                 "GLOO_SOCKET_IFNAME", "SLURM_JOB_ID",
                 "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NNODES", "SLURM_NTASKS",
                 "SLURM_JOB_PARTITION", "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT")
# every variable with these prefixes: what a user debugging a multi-node run needs to see
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def env_vars(environ=os.environ) -> dict:
    """The allow-listed variables and every NCCL_* / TORCH_NCCL_* that was set, sorted."""
    return {k: environ[k] for k in sorted(environ) if k in ENV_ALLOWLIST or k.startswith(ENV_PREFIXES)}
PACKAGES = ("torch", "torchvision", "transformers", "hydra-core", "deepspeed", "horovod",
            "fairscale", "wandb", "numpy")
REPO = Path(__file__).resolve().parents[2]


def network_ran_on(environ=os.environ) -> Optional[dict]:
    """The network the ranks ran on where one is described: $DDLBENCH_NETWORK (set inside `bench
    cluster`: its configured link rates), as {source, description}; None elsewhere. `bench report`'s
    projection check prices the run's collectives on it instead of conf/network/local_gloo.yaml."""
    path = environ.get("DDLBENCH_NETWORK")
    if not path:
        return None
    import yaml
    try:
        return {"source": path, "description": yaml.safe_load(Path(path).read_text())}
    except (OSError, yaml.YAMLError) as exc:
        return {"source": path, "description": None, "error": f"unreadable: {exc}"}


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=5, stdin=subprocess.DEVNULL)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def capture(device: torch.device, backend: str, threads_per_rank: int) -> dict:
    from ddlbench.machine.hardware import cpu_model

    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "packages": package_versions(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "backend": backend,
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "usable_cores": usable_cores(),
        "threads_per_rank": threads_per_rank,
        "torch_num_threads": torch.get_num_threads(),
        "git_sha": sha,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "argv0": Path(sys.argv[0]).name,
        "env_vars": env_vars(),
    }
    if device.type == "cuda":
        info["cudnn"] = torch.backends.cudnn.version()
        info["cudnn_benchmark"] = torch.backends.cudnn.benchmark
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["gpu_count"] = torch.cuda.device_count()
    return info
