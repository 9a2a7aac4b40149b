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
buildah bud --isolation=chroot --layers --format docker --build-arg BASE="$BASE" "${mirror[@]}" \
  --build-arg TORCH_INDEX=https://pypi.org/simple -f docker/Dockerfile.cpu -t "$IMAGE" .
# Run `bench run` in the image. podman/runc needs to set rlimits on the container process; where
# the host forbids that (some sandboxes: "error setting rlimit ... operation not permitted") the
# same image runs under buildah with chroot isolation, as the build steps did.
cmd=(bench run debug=fast logger=none launcher.nproc=2 run.dir=/tmp/run)
if podman run --rm "$IMAGE" true 2>/dev/null; then
  podman run --rm --network=host "$IMAGE" "${cmd[@]}"
else
  echo "podman run is not permitted here; running the image with buildah (chroot isolation)"
  ctr=$(buildah from "$IMAGE")
  trap 'buildah rm "$ctr" >/dev/null' EXIT
  buildah run --isolation=chroot --user 1000:1000 "$ctr" -- "${cmd[@]}"
fi
