#!/usr/bin/env bash
# A one-machine SLURM cluster for trying and testing troupe under SLURM:
# munge, one controller (slurmctld) and one node daemon (slurmd) on this
# machine, with a generated config (this machine's CPUs and memory, one
# partition), all state under one directory.
#
#   scripts/slurm-local.sh install   Debian's slurmd, slurmctld, slurm-client, munge
#   scripts/slurm-local.sh start     start the daemons; prints the SLURM_CONF to export
#   scripts/slurm-local.sh stop      stop them
#   scripts/slurm-local.sh env       the line to eval: export SLURM_CONF=...
#
# Then, e.g.:  eval "$(scripts/slurm-local.sh env)"
#              TROUPE_SECRET=... srun -n 3 -O troupe node --config examples/fashion_mnist_mirrored_env.json
# (-O, --overcommit: three tasks on a machine of fewer CPUs.) Ports and the
# directory: TROUPE_SLURM_DIR (default /tmp/troupe-slurm), TROUPE_SLURM_PORT
# (the controller's; the node daemon's is the next one; default 16817).
# Needs root (the daemons run as root here: a test cluster, not a site's).
set -euo pipefail

dir=${TROUPE_SLURM_DIR:-/tmp/troupe-slurm}
port=${TROUPE_SLURM_PORT:-16817}
conf=$dir/slurm.conf
host=$(hostname -s)

die() {
  echo "slurm-local: $*" >&2
  exit 1
}

install_packages() {
  local missing=()
  for p in slurmd slurmctld slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # The packages' own services must not start (no systemd here, and our
  # daemons use their own config and ports).
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_config() {
  local cpus mem_mib
  cpus=$(nproc)
  mem_mib=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat >"$conf" <<EOF
ClusterName=troupe-local
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
InactiveLimit=0
MinJobAge=60
NodeName=$host CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

start_munge() {
  [ -f /etc/munge/munge.key ] || die "/etc/munge/munge.key missing (is munge installed?)"
  if ! munge -n >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    # As the munge user when possible; --force where this system's
    # permissions (a container) do not satisfy munged's checks.
    if id munge >/dev/null 2>&1 && command -v runuser >/dev/null; then
      runuser -u munge -- munged --force 2>"$dir/log/munged.err" || munged --force
    else
      munged --force
    fi
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n >/dev/null 2>&1 || die "munged did not start (see $dir/log/munged.err)"
  fi
}

start() {
  [ "$(id -u)" -eq 0 ] || die "start needs root"
  command -v slurmctld >/dev/null || die "SLURM is not installed: scripts/slurm-local.sh install"
  write_config
  start_munge
  export SLURM_CONF=$conf
  stop_daemons quietly
  slurmctld -f "$conf" || die "slurmctld did not start (see $dir/log/slurmctld.log)"
  slurmd -f "$conf" || die "slurmd did not start (see $dir/log/slurmd.log)"
  for _ in $(seq 100); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm-local: up ($host, $(nproc) CPUs, controller port $port); export SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.2
  done
  sinfo >&2 || true
  tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  die "the node did not come up within 20 s"
}

stop_daemons() {
  for d in slurmd slurmctld; do
    local pidfile=$dir/$d.pid pid
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
  [ "${1:-}" = quietly ] || echo "slurm-local: stopped"
}

case "${1:-}" in
  install) install_packages ;;
  start) start ;;
  stop) stop_daemons ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *)
    echo "usage: scripts/slurm-local.sh install|start|stop|env" >&2
    exit 2
    ;;
esac
