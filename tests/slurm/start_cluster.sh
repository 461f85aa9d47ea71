#!/usr/bin/env bash
# A single-node Slurm cluster for the grader's tests, all of it under one directory (no system files touched):
#
#   bash tests/slurm/start_cluster.sh DIR      # starts munged, slurmctld and slurmd; prints SLURM_CONF=DIR/slurm.conf
#   bash tests/slurm/start_cluster.sh --stop DIR
#
# Needs Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and root (slurmd runs jobs as their
# submitter). Ports are picked free, so two clusters can run side by side. Exits non-zero, with the daemons'
# logs, if the node does not answer within $SLURM_START_TIMEOUT seconds (default 60).
set -euo pipefail

if [ "${1:-}" = "--stop" ]; then
  dir=$(cd "$2" && pwd)
  export SLURM_CONF="$dir/slurm.conf"
  # Jobs first (their slurmstepd would outlive slurmd), then the daemons.
  jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 40); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
  fi
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  exit 0
fi

dir=${1:?usage: start_cluster.sh DIR | --stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
for tool in munged mungekey slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "start_cluster: $tool not found (apt-get install -y slurm-wlm munge)" >&2; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "start_cluster: must run as root (slurmd starts jobs as their user)" >&2; exit 3; }

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)

mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
chmod 700 "$dir/munge"
[ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" 2>/dev/null \
  || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"

cat >"$dir/slurm.conf" <<CONF
ClusterName=gradertest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=60
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$host"

deadline=$(( $(date +%s) + ${SLURM_START_TIMEOUT:-60} ))
until sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "start_cluster: the node did not become idle; sinfo says: $(sinfo -h -N -o '%N %T %E' 2>&1)" >&2
    tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/munge/munged.log" >&2 2>/dev/null || true
    exit 4
  fi
  sleep 0.5
done
echo "SLURM_CONF=$SLURM_CONF"
