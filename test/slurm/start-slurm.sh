#!/bin/bash
# Starts a private one-node SLURM on this machine for tests: munged (unless
# one runs already), slurmctld and slurmd with their configuration, state and
# logs under DIR, on ports of their own, so /etc/slurm is left alone and
# concurrent test runs do not meet. Needs root (installs the packages with
# apt-get if they are missing).
#
#   start-slurm.sh DIR      then: SLURM_CONF=DIR/slurm.conf srun -n 4 ...
#   stop-slurm.sh DIR       stops exactly the daemons started here (DIR/pids)
set -u

die() { echo "start-slurm.sh: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: start-slurm.sh DIR"
dir=$1
[ "$(id -u)" = 0 ] || die "needs root to start munged, slurmctld and slurmd (runs as uid $(id -u))"

packages=""
for pair in slurmd:slurmd slurmctld:slurmctld srun:slurm-client munged:munge; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || packages="$packages ${pair#*:}"
done
if [ -n "$packages" ]; then
  command -v apt-get >/dev/null || die "missing$packages and no apt-get to install them"
  echo "start-slurm.sh: installing$packages" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=120 \
    --no-install-recommends $packages >"$dir.apt.log" 2>&1 ||
    die "apt-get install$packages failed; see $dir.apt.log"
fi

rm -rf "$dir"
mkdir -p "$dir/state" "$dir/slurmd" "$dir/log" || die "cannot create '$dir'"
: >"$dir/pids"
host=$(hostname)

# munged: one per machine, shared by every SLURM on it.
if ! pidof munged >/dev/null; then
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  [ -f /etc/munge/munge.key ] || mungekey -c >/dev/null 2>&1 || die "cannot create /etc/munge/munge.key"
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 0700 /etc/munge
  su -s /bin/sh munge -c /usr/sbin/munged || die "munged did not start; see /var/log/munge/munged.log"
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  [ -s /run/munge/munged.pid ] || die "munged did not write /run/munge/munged.pid"
  echo "munged $(cat /run/munge/munged.pid)" >>"$dir/pids"
fi

# Ports of this instance: another test run (or a real SLURM) may hold others.
port=$((20000 + (RANDOM % 4000) * 2))
cat >"$dir/slurm.conf" <<CONF
ClusterName=mttest$port
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=8000
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$dir/slurm.conf

# Waits (bounded) for a daemon's pid file and records the pid for stop-slurm.sh.
started() {
  local name=$1 pidfile=$2
  for _ in $(seq 100); do [ -s "$pidfile" ] && break; sleep 0.1; done
  [ -s "$pidfile" ] || die "$name did not start; see $dir/log/$name.log"
  echo "$name $(cat "$pidfile")" >>"$dir/pids"
}
/usr/sbin/slurmctld -f "$SLURM_CONF" || die "slurmctld did not start; see $dir/log/slurmctld.log"
started slurmctld "$dir/slurmctld.pid"
/usr/sbin/slurmd -f "$SLURM_CONF" || die "slurmd did not start; see $dir/log/slurmd.log"
started slurmd "$dir/slurmd.pid"

# The node registers within seconds; a node SLURM calls unknown is set idle.
for i in $(seq 100); do
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null)
  case "$state" in
    idle) exit 0 ;;
    unk*|down*) [ $((i % 10)) = 0 ] && scontrol update nodename="$host" state=idle >/dev/null 2>&1 ;;
  esac
  sleep 0.2
done
die "node $host is '${state:-not listed}' after 20 s, not idle; see $dir/log/"
