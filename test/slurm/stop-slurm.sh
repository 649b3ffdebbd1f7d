#!/bin/bash
# Stops the daemons start-slurm.sh DIR started (their ids are in DIR/pids),
# and nothing else: SIGTERM, then SIGKILL after 10 s.
set -u
[ $# -eq 1 ] || { echo "usage: stop-slurm.sh DIR" >&2; exit 1; }
pids=$1/pids
[ -f "$pids" ] || exit 0
# slurmd before slurmctld before munged: the reverse of starting.
ids=$(tac "$pids" | awk '{print $2}')
for id in $ids; do kill -TERM "$id" 2>/dev/null; done
for _ in $(seq 100); do
  alive=""
  for id in $ids; do kill -0 "$id" 2>/dev/null && alive="$alive $id"; done
  [ -z "$alive" ] && break
  sleep 0.1
done
for id in $alive; do kill -KILL "$id" 2>/dev/null; done
rm -f "$pids"
exit 0
