#!/usr/bin/env bash
# Build docker/Dockerfile.cpu without a Docker engine or a container registry, then run
# `bench run` inside the image. podman + buildah (Debian) with chroot isolation, from a local
# Debian bookworm base made by debootstrap (the Debian mirror is reachable; registries are not).
# Slow (a torch install inside the image, a Horovod build): not part of every CI run.
#   bash docker/build_cpu_podman.sh            # as root
set -euo pipefail
cd "$(dirname "$0")/.."
ROOTFS=${ROOTFS:-/var/tmp/ddlbench-bookworm}
BASE=localhost/debian-bookworm-local
IMAGE=localhost/ddlbench:cpu
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
# TORCH_INDEX: PyPI here (download.pytorch.org is not reachable from this machine); the
# Dockerfile's default is the CPU wheel index, which keeps the image small elsewhere.
buildah bud --isolation=chroot --layers --build-arg BASE="$BASE" \
  --build-arg TORCH_INDEX=https://pypi.org/simple -f docker/Dockerfile.cpu -t "$IMAGE" .
podman run --rm --network=host "$IMAGE" bench run debug=fast logger=none launcher.nproc=2 run.dir=/tmp/run
