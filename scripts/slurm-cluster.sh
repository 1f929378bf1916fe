#!/usr/bin/env bash
# A real one-machine Slurm cluster (munged + slurmctld + slurmd), for the tests and for trying
# `srun` locally. Configuration, state and logs live in $HVDTRAIN_SLURM_DIR (default: .slurm/ in
# the clone), never in /etc. Run as root.
#   bash scripts/slurm-cluster.sh start    # writes the config, starts the daemons, waits for an idle node
#   bash scripts/slurm-cluster.sh status
#   bash scripts/slurm-cluster.sh stop
#   eval "$(bash scripts/slurm-cluster.sh env)"   # SLURM_CONF for srun/sbatch/squeue in this shell
#   bash scripts/slurm-cluster.sh config   # only write $HVDTRAIN_SLURM_DIR/slurm.conf
# Other shapes (the tests' second clusters: nodes shaped like Jean Zay's, two nodes on one machine)
# use the same configuration with these set: HVDTRAIN_SLURM_NODES (NodeName/PartitionName lines),
# HVDTRAIN_SLURM_EXTRA (more lines), HVDTRAIN_SLURM_CLUSTER_NAME, HVDTRAIN_SLURMCTLD_ADDR and
# HVDTRAIN_MUNGE_SOCKET (an already running munged: no key of its own is made).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/scripts/env.sh"
DIR=${HVDTRAIN_SLURM_DIR:-$REPO/.slurm}
CONF=$DIR/slurm.conf
NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
CTLD_PORT=${HVDTRAIN_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${HVDTRAIN_SLURMD_PORT:-6818}
CLUSTER_NAME=${HVDTRAIN_SLURM_CLUSTER_NAME:-hvdtrain}
CTLD_ADDR=${HVDTRAIN_SLURMCTLD_ADDR:-127.0.0.1}
MUNGE_SOCKET=${HVDTRAIN_MUNGE_SOCKET:-$DIR/munge/munge.socket}
NODES=${HVDTRAIN_SLURM_NODES:-"NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"}
EXTRA=${HVDTRAIN_SLURM_EXTRA:-}
export SLURM_CONF=$CONF

say() { printf '[slurm-cluster] %s\n' "$*"; }
die() { say "$*"; exit 1; }

write_config() {
    mkdir -p "$DIR"/{state,log,run,munge,tmp}
    chmod 700 "$DIR/munge"
    if [ -z "${HVDTRAIN_MUNGE_SOCKET:-}" ] && [ ! -s "$DIR/munge/munge.key" ]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$DIR/munge/munge.key"
    fi
    cat >"$CONF" <<CONF
# Written by scripts/slurm-cluster.sh on $NODE.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job waits this long before it may start again (default 120 s); a step's
# launch credential lives as long, ample on one machine. sched_interval: the main scheduling pass,
# which is what starts a requeued job once it may (default every 60 s; backfill did not).
# Measured: scontrol requeue -> running again 55 s with the defaults and cred_expire=30, 7.5 s with 5.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/state
# Per node (%n): several slurmd of one cluster may run on this machine.
SlurmdSpoolDir=$DIR/spool-%n
# Per-cluster scratch (PMIx puts its per-step directories here): two local clusters both number
# jobs from 1, and in a shared /tmp their steps' directories would collide.
TmpFS=$DIR/tmp
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
# As at sites (30-60 s): a failure must end a job at hvdtrain's pace, not at a short KillWait.
KillWait=60
InactiveLimit=0
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
$EXTRA
$NODES
CONF
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    [ "$(id -u)" = 0 ] || die "run as root (the daemons run as root here)"
    command -v slurmctld >/dev/null || die "Slurm is not installed: run bash scripts/setup.sh"
    write_config
    if ! pid_alive "$DIR/run/munged.pid"; then
        munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
               --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
               --seed-file="$DIR/munge/munge.seed" || die "munged failed to start: see $DIR/log/munged.log"
    fi
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF" || die "slurmctld failed: see $DIR/log/slurmctld.log"
    pid_alive "$DIR/run/slurmd-$NODE.pid" || slurmd -f "$CONF" || die "slurmd failed: see $DIR/log/slurmd-$NODE.log"
    local state="" i
    for i in $(seq 1 60); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
        case "$state" in idle|mixed|allocated) break ;; esac
        sleep 0.25
    done
    case "$state" in
        idle|mixed|allocated) ;;
        down*|drain*) scontrol update nodename="$NODE" state=resume || true; sleep 2
                      state=$(sinfo -h -n "$NODE" -o %T) ;;
    esac
    case "$state" in idle|mixed|allocated) ;; *)
        die "node $NODE not ready (state '${state:-none}') after 60 s: see $DIR/log/slurmctld.log and slurmd-$NODE.log" ;;
    esac
    say "node $NODE is $state; checking srun --mpi=pmix -n 2"
    local probe="hostname"
    if [ -x "$HVDTRAIN_VENV/bin/python" ] && "$HVDTRAIN_VENV/bin/python" -c "import mpi4py" 2>/dev/null; then
        probe="$HVDTRAIN_VENV/bin/python -c 'from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.Get_size() == 2, c.Get_size(); print(\"rank\", c.Get_rank(), \"of\", c.Get_size())'"
    fi
    timeout 120 srun --mpi=pmix -n 2 -t 2 bash -c "$probe" || die "srun --mpi=pmix -n 2 failed (probe: $probe)"
    say "ready. In your shell: export SLURM_CONF=$CONF"
}

stop() {
    local f
    for f in "slurmd-$NODE" slurmctld munged; do
        if pid_alive "$DIR/run/$f.pid"; then
            kill "$(cat "$DIR/run/$f.pid")" 2>/dev/null || true
        fi
    done
    for f in "slurmd-$NODE" slurmctld munged; do
        for _ in $(seq 1 20); do pid_alive "$DIR/run/$f.pid" || break; sleep 0.5; done
        rm -f "$DIR/run/$f.pid"
    done
    say "stopped"
}

status() {
    local f
    for f in munged slurmctld "slurmd-$NODE"; do
        if pid_alive "$DIR/run/$f.pid"; then say "$f running (pid $(cat "$DIR/run/$f.pid"))"; else say "$f not running"; fi
    done
    pid_alive "$DIR/run/slurmctld.pid" && sinfo
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    config) write_config; say "wrote $CONF" ;;
    *) echo "usage: $0 start|stop|restart|status|env|config"; exit 2 ;;
esac
