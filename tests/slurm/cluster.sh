#!/usr/bin/env bash
# A real one-node SLURM cluster on localhost, for the cluster tests (and for trying the
# slurm profile on one machine): Debian's slurmctld, slurmd and munge.
#   bash tests/slurm/cluster.sh start   install (when missing), configure, start, wait for the node
#   bash tests/slurm/cluster.sh stop    cancel its jobs, stop the daemons, remove its slurm.conf
#   bash tests/slurm/cluster.sh status  exit 0 when the node is up
# State, logs and the job completion log (jobcomp.log: one line per finished job with
# its start, end and nodes) go under $STUDY_SLURM_DIR (default /tmp/study-slurm).
# The configuration must be /etc/slurm/slurm.conf: the executor plugin's inner srun
# drops every SLURM_* variable, SLURM_CONF too. A slurm.conf that this script did not
# write is never touched: start refuses to run on a machine that already has one.
# Ports 6817-6818 are fixed, so one such cluster per machine at a time. Needs root
# (or sudo) for apt, /etc/slurm and the daemons.
set -euo pipefail

DIR=${STUDY_SLURM_DIR:-/tmp/study-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by cpu-train-study tests/slurm/cluster.sh"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

install_packages() {
    local missing=()
    for pkg in slurmctld slurmd slurm-client munge; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        command -v apt-get >/dev/null || { echo "cluster.sh: needs apt-get to install ${missing[*]}" >&2; exit 1; }
        echo "cluster.sh: installing ${missing[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
}

start_munge() {
    if [ -f "$DIR/munged.pid" ] && kill -0 "$(cat "$DIR/munged.pid")" 2>/dev/null; then return; fi
    $SUDO mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    [ -s /etc/munge/munge.key ] || $SUDO mungekey --create --keyfile=/etc/munge/munge.key
    $SUDO chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    $SUDO chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    $SUDO chmod 0400 /etc/munge/munge.key
    $SUDO chmod 0755 /run/munge
    $SUDO runuser -u munge -- munged --pid-file="/run/munge/munged.pid" --force
    $SUDO cp /run/munge/munged.pid "$DIR/munged.pid"
}

write_conf() {
    local cpus mem_mb
    cpus=$(nproc)
    # what slurmd reports, less a margin for the daemons and the submit host's Snakemake
    mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    $SUDO mkdir -p /etc/slurm
    $SUDO tee "$CONF" >/dev/null <<CONF
$MARK
ClusterName=study-localhost
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
# squeue still sees finished jobs for 5 minutes (the executor plugin's squeue status)
MinJobAge=300
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=study Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

node_state() { sinfo -h -N -n localhost -o %T 2>/dev/null | head -1; }

start() {
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        echo "cluster.sh: $CONF exists and was not written by this script; refusing to touch it" >&2
        exit 1
    fi
    if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
        echo "cluster.sh: already running (stop it first: bash $0 stop)" >&2
        exit 1
    fi
    install_packages
    $SUDO mkdir -p "$DIR/state" "$DIR/spool"
    $SUDO rm -f "$DIR"/*.log
    start_munge
    write_conf
    $SUDO slurmctld -i
    $SUDO slurmd -N localhost
    local state=""
    for _ in $(seq 60); do
        state=$(node_state)
        case "$state" in
        idle*) echo "cluster.sh: node localhost $state ($(nproc) CPUs), logs in $DIR"; return 0 ;;
        down* | drain*) $SUDO scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    echo "cluster.sh: the node did not come up (state: '${state:-none}'); see $DIR/slurmctld.log and $DIR/slurmd.log" >&2
    tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
    stop
    exit 1
}

stop_pid() {  # name pidfile
    local pid
    [ -f "$2" ] || return 0
    pid=$(cat "$2")
    if kill -0 "$pid" 2>/dev/null; then
        $SUDO kill "$pid" 2>/dev/null || true
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && $SUDO kill -9 "$pid" 2>/dev/null || true
    fi
    $SUDO rm -f "$2"
}

stop() {
    if [ -e "$CONF" ] && grep -qF "$MARK" "$CONF"; then
        # the jobs first (their steps and processes), while the daemons can still do it
        timeout 10 scancel --partition=study >/dev/null 2>&1 || true
        for _ in $(seq 40); do
            [ -z "$(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    stop_pid slurmd "$DIR/slurmd.pid"
    stop_pid slurmctld "$DIR/slurmctld.pid"
    stop_pid munged "$DIR/munged.pid"
    # processes of jobs that a killed slurmd left behind
    $SUDO pkill -f "slurmstepd" 2>/dev/null || true
    if [ -e "$CONF" ] && grep -qF "$MARK" "$CONF"; then $SUDO rm -f "$CONF"; fi
    echo "cluster.sh: stopped"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) [[ "$(node_state)" =~ ^(idle|mixed|allocated) ]] ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
