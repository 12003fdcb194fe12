#!/usr/bin/env bash
# A one-node SLURM on this machine, for tests and trying the batch script out: installs
# Debian's slurm-wlm and munge when missing (as root), writes a configuration under a state
# folder, starts munged, slurmctld and slurmd in the background (no systemd, no cgroups) and
# waits until the node takes jobs.
#
#   deploy/slurm/local-slurm.sh start STATE_DIR   # prints: export SLURM_CONF=STATE_DIR/slurm.conf
#   deploy/slurm/local-slurm.sh stop STATE_DIR    # cancels jobs, stops the daemons it started
set -euo pipefail

cmd=${1:?usage: local-slurm.sh start|stop STATE_DIR}
state=${2:?usage: local-slurm.sh start|stop STATE_DIR}
wait_s=${MGPU_SLURM_WAIT:-60}

stop() {
  if [ -f "$state/slurm.conf" ]; then
    SLURM_CONF="$state/slurm.conf" scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  fi
  for p in slurmd slurmctld munged; do
    if [ -f "$state/$p.pid" ]; then
      kill "$(cat "$state/$p.pid")" 2>/dev/null || true
      rm -f "$state/$p.pid"
    fi
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: local-slurm.sh start|stop STATE_DIR" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "SLURM is not installed and cannot be installed here (needs root and apt-get)" >&2
    exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get install -y -q --no-install-recommends slurm-wlm munge >"$state.apt.log" 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && timeout 600 apt-get install -y -q \
         --no-install-recommends slurm-wlm munge >"$state.apt.log" 2>&1; } \
    || { echo "apt-get install slurm-wlm munge failed; see $state.apt.log" >&2; exit 3; }
fi

mkdir -p "$state"/{spool,ctld,log}
node=$(hostname -s)
# the node as slurmd sees it (nproc would follow OMP_NUM_THREADS, which Dask sets to 1)
hw=$(slurmd -C | head -n 1)
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
cpus=${cpus:-$(getconf _NPROCESSORS_ONLN)}
mem=$(( ${mem:-4096} * 9 / 10 ))
user=$(id -un)
cat >"$state/slurm.conf" <<CONF
ClusterName=mgpu-local
SlurmctldHost=$node
SlurmUser=$user
SlurmdUser=root
SlurmctldPort=${MGPU_SLURM_PORT:-6817}
SlurmdPort=$(( ${MGPU_SLURM_PORT:-6817} + 1 ))
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.daemon.pid
SlurmdPidFile=$state/slurmd.daemon.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

# munge: a key if there is none, the daemon in the foreground mode under our control
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge && mungekey --create --force >/dev/null 2>&1 \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
if ! munge -n >/dev/null 2>&1; then
  munged --force -F >"$state/log/munged.log" 2>&1 &
  echo $! >"$state/munged.pid"
fi
export SLURM_CONF="$state/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$state/log/slurmctld.stdout" 2>&1 &
echo $! >"$state/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" >"$state/log/slurmd.stdout" 2>&1 &
echo $! >"$state/slurmd.pid"

for _ in $(seq "$wait_s"); do
  if sinfo -h -N -o "%t" 2>/dev/null | grep -qE "^(idle|mix|alloc)"; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 1
done
echo "the local SLURM node did not become idle within ${wait_s} s; logs in $state/log" >&2
sinfo -N -l >&2 || true
stop
exit 4
