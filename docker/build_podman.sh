#!/usr/bin/env bash
# Build docker/Dockerfile.cpu or docker/Dockerfile.gpu without a Docker engine or a container
# registry, then check the image from inside. podman + buildah (Debian) with chroot isolation,
# from a local Debian bookworm base made by debootstrap (the Debian mirror is reachable;
# registries are not). Slow (torch inside the image, a Horovod build): not part of every CI run.
#   bash docker/build_podman.sh [cpu|gpu]      # as root; default cpu
# cpu: `bench run` at 2 ranks in the image.
# gpu: (no GPU needed to build) DeepSpeed's op report, Horovod's build report with NCCL, and
#      `bench run` refusing to fall back to CPU (the image says GPUs are expected), then the
#      same run with run.device=cpu deliberately.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-cpu}
case "$MODE" in cpu|gpu) ;; *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;; esac
ROOTFS=${ROOTFS:-/var/tmp/ddlbench-bookworm}
BASE=localhost/debian-bookworm-local
IMAGE=localhost/ddlbench:$MODE
export DEBIAN_FRONTEND=noninteractive
for tool in podman buildah debootstrap runc; do
  command -v "$tool" >/dev/null || { apt-get update -qq; apt-get install -y -qq podman buildah debootstrap runc >/dev/null; break; }
done
# runc needs limits it may raise here
mkdir -p /etc/containers
grep -q default_ulimits /etc/containers/containers.conf 2>/dev/null || cat >> /etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024"]
CONF
if ! podman image exists "$BASE"; then
  [ -x "$ROOTFS/bin/bash" ] || debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian
  tar -C "$ROOTFS" -c . | podman import - "$BASE"
fi
# TORCH_INDEX (cpu): PyPI here (download.pytorch.org is not reachable from this machine); the
# Dockerfile's default is the CPU wheel index, which keeps the image small elsewhere.
# A machine with a local wheel mirror (pip's extra-index-url under /opt) lends it to the build
# read-only, so torch comes from disk instead of the network.
mirror=()
extra=$(pip config get global.extra-index-url 2>/dev/null || true)
if [ -n "$extra" ]; then
  for dir in /opt/pypi /opt/pypi-more /opt/wheels; do
    [ -d "$dir" ] && mirror+=(--volume "$dir:$dir:ro")
  done
  mirror+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra")
fi
# A TLS-intercepting proxy's CA (pip's cert bundle: $PIP_CERT or pip config) is lent to the build too.
cert=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  mirror+=(--volume "$cert:/etc/host-ca.crt:ro" --build-arg PIP_CERT=/etc/host-ca.crt)
fi
[ "$MODE" = cpu ] && mirror+=(--build-arg TORCH_INDEX=https://pypi.org/simple)
buildah bud --isolation=chroot --layers --format docker --build-arg BASE="$BASE" "${mirror[@]}" \
  -f "docker/Dockerfile.$MODE" -t "$IMAGE" .
# Run the checks in the image. podman/runc needs to set rlimits on the container process; where
# the host forbids that (some sandboxes: "error setting rlimit ... operation not permitted") the
# same image runs under buildah with chroot isolation, as the build steps did.
in_image() {
  if podman run --rm "$IMAGE" true 2>/dev/null; then
    podman run --rm --network=host "$IMAGE" "$@"
  else
    local ctr rc=0
    ctr=$(buildah from "$IMAGE")
    buildah run --isolation=chroot --user "$(podman image inspect -f '{{.Config.User}}' "$IMAGE")" "$ctr" -- "$@" || rc=$?
    buildah rm "$ctr" >/dev/null
    return $rc
  fi
}
podman run --rm "$IMAGE" true 2>/dev/null || echo "podman run is not permitted here; running the image with buildah (chroot isolation)"
cmd=(bench run debug=fast logger=none launcher.nproc=2 run.progress=false run.dir=/tmp/run)
if [ "$MODE" = cpu ]; then
  in_image "${cmd[@]}"
  exit 0
fi
in_image bash -c 'DS_ACCELERATOR=cuda ds_report | grep -E "cpu_adam|torch (version|cuda)|nvcc|deepspeed (install|info)"'
in_image horovodrun --check-build
in_image python -c 'import horovod.torch as h, torch; assert h.nccl_built(); print("horovod nccl_built:", h.nccl_built(), "torch", torch.__version__, "cuda", torch.version.cuda)'
# no GPU here: the image expects one, so the run must fail with the reason, not train on CPU
if in_image "${cmd[@]}"; then echo "FAIL: bench run trained without a GPU in the GPU image" >&2; exit 1; fi
in_image bash -c "${cmd[*]} run.device=cpu"
