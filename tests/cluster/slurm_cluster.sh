#!/usr/bin/env bash
# A one-node Slurm cluster on loopback, private to one test run: its own munge key and socket,
# slurmctld and slurmd with their state, logs and spool under DIR, nothing under /etc touched.
#   slurm_cluster.sh start DIR   starts munged, slurmctld and slurmd; prints the SLURM_CONF to export
#   slurm_cluster.sh stop DIR    stops them (also after a failed start)
# Needs root (slurmd starts the tasks as the submitting user and runs as root here) and
# Debian's munge, slurmctld, slurmd and slurm-client.
set -euo pipefail

action=${1:?usage: slurm_cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: slurm_cluster.sh start|stop DIR}")

stop() {
  for name in slurmd slurmctld munged; do
    if [ -f "$dir/$name.pid" ]; then
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$name.pid"
    fi
  done
}

if [ "$action" = stop ]; then
  stop
  exit 0
fi
[ "$action" = start ] || { echo "slurm_cluster.sh: unknown action '$action' (start or stop)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root to run slurmd" >&2; exit 2; }
for tool in munged slurmctld slurmd srun; do
  command -v "$tool" >/dev/null || { echo "slurm_cluster.sh: $tool is not installed (scripts/install-deps.sh installs it)" >&2; exit 2; }
done

mkdir -p "$dir"/{munge,state,spool,log}
chmod 700 "$dir/munge"
dd if=/dev/urandom of="$dir/munge/key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/key"
node=$(hostname -s)
# Ports: above the usual ones, chosen from the directory so that two clusters on one machine
# (two test runs) do not collide.
base=$((20000 + $(echo -n "$dir" | cksum | cut -d' ' -f1) % 20000))
cat > "$dir/slurm.conf" <<CONF
ClusterName=sluice-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

trap 'stop' ERR
munged --key-file="$dir/munge/key" --socket="$dir/munge/socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" --force
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
echo "slurm_cluster.sh: the node did not become idle in 20 s; logs in $dir/log:" >&2
tail -n 20 "$dir"/log/*.log >&2 || true
stop
exit 1
