#!/usr/bin/env bash
# A real single-node Slurm on localhost for the tests: `install` (apt, as root), `start`
# (idempotent; installs if needed) or `stop`. Needs root and Debian's slurmctld slurmd slurm-client munge
# slurm-wlm-basic-plugins libpmix2, and for accounting (sacct) slurmdbd + mariadb-server
# (installed here with apt when missing). Daemons are started by hand (no systemd):
# munged -> mariadbd -> slurmdbd -> slurmctld -> slurmd.
set -euo pipefail
STATE=${SLURM_LOCAL_STATE:-/var/tmp/ddlbench-slurm}
HERE=$(cd "$(dirname "$0")/.." && pwd)
t() { timeout 10 "$@"; }   # Slurm clients block while slurmctld is down
# Only this machine's own daemons: an emulated cluster (`bench cluster`) runs slurmd, slurmctld,
# munged and mariadbd of the same names in a mount namespace of its own.
pgrep() { command pgrep --ns $$ --nslist mnt "$@"; }
pkill() { command pkill --ns $$ --nslist mnt "$@"; }
trap 'echo "slurm_local.sh: failed at line $LINENO (logs in $STATE)" >&2' ERR

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v slurmdbd >/dev/null \
    && command -v mariadbd >/dev/null && command -v tc >/dev/null && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    slurm-wlm-basic-plugins libpmix2 libpmix-dev slurmdbd mariadb-server iproute2 >/dev/null
}

accounting() {
  # MariaDB on 127.0.0.1, a database user for slurmdbd (password kept in the state dir, 0600)
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! pgrep -x mariadbd >/dev/null; then
    mariadbd --user=mysql --bind-address=127.0.0.1 >"$STATE/mariadb.log" 2>&1 &
  fi
  for _ in $(seq 1 30); do timeout 5 mariadb -e "select 1" >/dev/null 2>&1 && break; sleep 1; done
  [ -s "$STATE/dbpass" ] || { (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$STATE/dbpass"); }
  local pass
  pass=$(cat "$STATE/dbpass")
  timeout 10 mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  (umask 077; sed -e "s#@STATE@#$STATE#g" -e "s#@DBPASS@#$pass#g" \
    "$HERE/slurm/local/slurmdbd.conf.in" > /etc/slurm/slurmdbd.conf)
  chmod 600 /etc/slurm/slurmdbd.conf
  pgrep -x slurmdbd >/dev/null || slurmdbd
  for _ in $(seq 1 30); do t sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
  t sacctmgr -n list cluster format=cluster | grep -qw ddlbench || t sacctmgr -i add cluster ddlbench >/dev/null
}

first_job_id() {
  # Job ids must never repeat an id the accounting database already holds: a fresh StateSaveLocation
  # restarts slurmctld's counter at 1 while MariaDB keeps old jobs, and `sacct -j N` would then
  # report a finished job of the past as this one (submitit took a running array for done).
  local max
  max=$(timeout 10 mariadb -N -e "SELECT COALESCE(MAX(id_job), 0) FROM slurm_acct_db.ddlbench_job_table" \
    2>/dev/null || echo 0)
  echo $(( ${max:-0} + 1 ))
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
  accounting
  sed -i "s#^FirstJobId=.*#FirstJobId=$(first_job_id)#" /etc/slurm/slurm.conf
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
  local d
  for d in slurmd slurmctld slurmdbd mariadbd munged; do
    pkill -x "$d" || true
    # wait for it to exit (a dying mariadbd still matches pgrep, and the next `start` would skip it)
    timeout 30 bash -c "while pgrep --ns $$ --nslist mnt -x $d >/dev/null; do sleep 0.2; done" || pkill -9 -x "$d" || true
  done
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
