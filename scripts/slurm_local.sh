#!/usr/bin/env bash
# A real single-node Slurm on localhost for the tests: `install` (apt, as root), `start`
# (idempotent; installs if needed) or `stop`. Needs root and Debian's slurmctld slurmd slurm-client munge
# slurm-wlm-basic-plugins libpmix2 (installed here with apt when missing).
set -euo pipefail
STATE=${SLURM_LOCAL_STATE:-/var/tmp/ddlbench-slurm}
HERE=$(cd "$(dirname "$0")/.." && pwd)
t() { timeout 10 "$@"; }   # Slurm clients block while slurmctld is down

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    slurm-wlm-basic-plugins libpmix2 libpmix-dev >/dev/null
}

start() {
  install
  mkdir -p "$STATE/ctld" "$STATE/d" /run/munge /etc/slurm
  chown munge:munge /run/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged --force"
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  sed -e "s#@STATE@#$STATE#g" -e "s#@CPUS@#$cpus#g" -e "s#@MEM@#$mem#g" \
    "$HERE/slurm/local/slurm.conf.in" > /etc/slurm/slurm.conf
  pgrep -x slurmctld >/dev/null || slurmctld -i
  pgrep -x slurmd >/dev/null || slurmd -N localhost
  for _ in $(seq 1 60); do
    if t sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm: up ($(t sinfo -h -o '%P %D %T %c cpus'))"; return 0
    fi
    t scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm: did not come up; logs in $STATE" >&2
  tail -5 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
  return 1
}

stop() {
  # cancel what is still queued or finishing (e.g. an srun that outlives its task), let it end,
  # then stop the daemons and any step daemon left behind: no orphan processes
  if pgrep -x slurmctld >/dev/null; then
    t scancel --full --user="$(id -un)" >/dev/null 2>&1 || true
    timeout 15 bash -c 'while [ -n "$(timeout 5 squeue -h 2>/dev/null)" ]; do sleep 1; done' || true
  fi
  pkill -x slurmd || true
  pkill -x slurmctld || true
  pkill -x munged || true
  pkill -f '^slurmstepd' || true
  sleep 1
  pkill -9 -f '^slurmstepd' || true
}

case "${1:-start}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
