#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (slurmctld + slurmd on localhost,
# munge authentication), for the tests and for trying the job files:
#
#   scripts/slurm/local_cluster.sh start DIR   # prints: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/local_cluster.sh stop DIR
#
# Needs root and Debian's slurm-wlm and munge (scripts/setup.sh installs them).
# State, spool and logs live in DIR; nothing outside it is changed except the
# munge key (/etc/munge/munge.key), made when missing. `stop` ends the
# daemons `start` started (their pids are in DIR): slurmd, slurmctld, and
# munged when start had to start it (a munged already running is left alone).
set -euo pipefail
cmd=${1:-} dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 1
fi
mkdir -p "$dir"
dir=$(realpath "$dir")
conf=$dir/slurm.conf
case "$cmd" in
start)
  mkdir -p "$dir/state" "$dir/spool" /etc/munge /run/munge /var/lib/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge: /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 0400 /etc/munge/munge.key
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    rm -f /run/munge/munged.pid
    su -s /bin/sh munge -c "munged --force" || munged --force
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    # note: munged (as the munge user) cannot write DIR; its pid is copied
    # here for stop, which ends it only when start started it.
    if [ -s /run/munge/munged.pid ]; then cp /run/munge/munged.pid "$dir/munged.pid"; fi
  fi
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  cat >"$conf" <<CONF
ClusterName=qtk-local
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ReturnToService=2
JobRequeue=1
MpiDefault=none
NodeName=localhost CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  slurmctld -f "$conf" -i
  slurmd -f "$conf"
  for _ in $(seq 100); do
    SLURM_CONF=$conf sinfo -h -o %T 2>/dev/null | grep -q idle && break
    sleep 0.2
  done
  SLURM_CONF=$conf sinfo -h -o %T | grep -q idle || {
    echo "local_cluster.sh: the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    exit 1
  }
  echo "export SLURM_CONF=$conf"
  ;;
stop)
  # note: munged last: slurmd and slurmctld use it until they end. A pid
  # whose process is no longer that daemon (ended, pid reused) is skipped.
  for d in slurmd slurmctld munged; do
    if [ -f "$dir/$d.pid" ]; then
      pid=$(cat "$dir/$d.pid")
      if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$d" ]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
          echo "local_cluster.sh: $d (pid $pid) did not end in 5 s; killing it" >&2
          kill -9 "$pid" 2>/dev/null || true
        fi
      fi
      rm -f "$dir/$d.pid"
    fi
  done
  ;;
*) echo "local_cluster.sh: expected start or stop, found '$cmd'" >&2; exit 1 ;;
esac
