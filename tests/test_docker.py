"""The project's images: Dockerfiles lint clean (hadolint), run as a non-root user, pin what
they install, and copy only files that exist. Building them needs an engine (see
docker/build_podman.sh for a build without one)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))


def test_there_is_a_cpu_and_a_gpu_image():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.gpu"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path):
    hadolint = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run([str(hadolint), "--config", str(REPO / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_non_root_pinned_and_copies_exist(path):
    text = path.read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert re.search(r"^USER [1-9]\d*:\d+$", final_stage, re.M), "final stage must run as non-root"
    assert "torch==2.14.1" in text and "deepspeed==0.19.8" in text
    for src in re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(.+) \S+$", text, re.M):
        for item in src.split():
            assert (REPO / item).exists(), f"{path.name} copies {item}, which does not exist"
    for line in (REPO / "docker" / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[\w.-]+==[\w.]+", line), line


def final_stage_env(dockerfile: Path) -> dict:
    """KEY=VALUE pairs of the ENV instructions after the last FROM (what the image runs with)."""
    import shlex
    text = dockerfile.read_text().replace("\\\n", " ")
    stage = text[text.rindex("\nFROM "):]
    env = {}
    for line in stage.splitlines():
        if line.startswith("ENV "):
            env.update(kv.split("=", 1) for kv in shlex.split(line[4:]) if "=" in kv)
    return env


def test_gpu_image_asks_the_container_runtime_for_gpus():
    """enroot/pyxis and nvidia-container-toolkit mount GPUs only into images that set these."""
    env = final_stage_env(REPO / "docker" / "Dockerfile.gpu")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert env["DDLBENCH_EXPECT_GPU"] == "1"


def test_slurm_templates_are_valid_bash():
    for script in sorted((REPO / "slurm").glob("*.sbatch")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


def test_gpu_container_templates_share_the_hosts_ipc_and_dev_shm():
    """NCCL's shared-memory and P2P transports between the ranks of a node need one /dev/shm and
    IPC namespace; a container per task with its own falls back to the network transport."""
    pyxis = (REPO / "slurm" / "multinode_pyxis.sbatch").read_text()
    assert "/dev/shm:/dev/shm" in pyxis.split("--container-mounts=", 1)[1].split()[0]
    for script in ("multinode_apptainer.sbatch",):
        cmd = [line for line in (REPO / "slurm" / script).read_text().splitlines()
               if not line.lstrip().startswith("#")]
        assert not any(flag in " ".join(cmd) for flag in ("--contain", "--ipc", "--no-mount dev")), script


def test_gpu_image_builds_horovods_kernels_for_every_bf16_generation():
    """It built for 8.0 and 9.0 only: Horovod on an L4, L40, A10 or RTX (8.6, 8.9) or a B200 (10.0)
    had no kernels for its GPU."""
    dockerfile = (REPO / "docker" / "Dockerfile.gpu").read_text()
    arch = dockerfile.split('ARG TORCH_CUDA_ARCH_LIST="', 1)[1].split('"', 1)[0].split(";")
    assert {"8.0", "8.6", "8.9", "9.0", "10.0"} <= set(arch)
    assert f'TORCH_CUDA_ARCH_LIST:-{";".join(arch)}' in (REPO / "scripts" / "build_horovod.sh").read_text()
