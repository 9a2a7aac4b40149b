#!/usr/bin/env bash
# System packages the test suite needs: Debian's chromium (report.html is checked in a real
# headless browser) and Slurm + munge + slurmdbd + MariaDB (sweeps run through a real
# single-node Slurm with job accounting, scripts/slurm_local.sh). Installs with apt when run as root; otherwise says what to install.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmdbd >/dev/null 2>&1 || ! command -v mariadbd >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing slurm + munge + slurmdbd + mariadb (apt)"
    bash "$HERE/slurm_local.sh" install
  else
    echo "the tests need Slurm: sudo apt-get install slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins libpmix2 slurmdbd mariadb-server" >&2
    exit 2
  fi
fi
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium (apt, ~1 min)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
  echo "the tests need Chromium: install Debian's 'chromium' package (sudo apt-get install chromium)" >&2
  exit 2
fi
