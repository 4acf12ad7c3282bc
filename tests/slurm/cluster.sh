#!/usr/bin/env bash
# A real SLURM cluster of several nodes on this one machine, for the cluster tests (and
# for trying the slurm profile): Debian's slurmctld, slurmd and munge. Each compute node
# is a network namespace with a UTS namespace of its own: its own hostname
# (study-node1, study-node2, ...), its own address on a private bridge that this script
# creates, its own slurmd, and its own share of the machine's CPUs (slurmd is started
# on them, so everything a job runs there sees only them). The controller listens on
# the bridge alone (as study-ctl), the accounting daemons (slurmdbd, MariaDB) in a
# namespace of their own on it (study-db): nothing listens on the machine's other
# addresses. The filesystem is the machine's: shared by every node, as on a cluster.
#   bash tests/slurm/cluster.sh start   install (when missing), configure, start, wait for the nodes
#   bash tests/slurm/cluster.sh stop    cancel its jobs, stop what it started, remove what it made
#   bash tests/slurm/cluster.sh status  exit 0 when every node is up (idle, held for a waiting job, in use, or ending a job) within 10 s
# Settings (environment):
#   STUDY_SLURM_DIR     state, logs, pid files, and jobcomp.log (one line per finished
#                       job: start, end, nodes, state) (default /tmp/study-slurm). The
#                       script makes it (mode 0700) or uses one that is yours, a real
#                       folder that no one else can write; any other is refused.
#   STUDY_SLURM_NODES   compute nodes (default 2)
#   STUDY_SLURM_MEM_MB  each node's RealMemory, which whole-node jobs ask for and SLURM
#                       enforces (jobacct_gather's OverMemoryKill) (default 4096)
#   STUDY_SLURM_MPI     MpiDefault, SLURM's MPI plugin for every srun: none, pmi2 or pmix,
#                       as sites set it (default none)
#   STUDY_SLURM_ACCOUNTING  1: accounting, as sites run it: slurmdbd over a MariaDB
#                       server of the cluster's own (its data under $STUDY_SLURM_DIR/mysql,
#                       on 127.0.0.1:$STUDY_SLURM_DB_PORT, default 3307), so that sacct
#                       answers (default 0: none)
# The configuration must be /etc/slurm/slurm.conf: the executor plugin's inner srun
# drops every SLURM_* variable, SLURM_CONF too. A slurm.conf that this script did not
# write is never touched, and start refuses to run where one exists.
# What start made is written down in $STUDY_SLURM_DIR/made (pids of the daemons it
# started, the namespaces, bridge and links it created, the /etc/hosts lines it
# added); stop removes exactly that, and only when the running cluster is this
# directory's: a second session's stop touches neither the first one's jobs nor its
# daemons. Ports 6817-6818 are fixed, so one such cluster per machine at a time.
# Needs root (or sudo) for apt, /etc/slurm, namespaces and the daemons.
# Trusts nothing in /tmp: what it reads back from its state folder (the list of what it
# made) is checked entry by entry against the names it gives things and never reaches
# an interpreter (no sed, no eval); the database password is new at every start; every
# file it creates is private (umask 077) but slurm.conf, which SLURM's commands read.
set -euo pipefail
umask 077

DIR=${STUDY_SLURM_DIR:-/tmp/study-slurm}
NODES=${STUDY_SLURM_NODES:-2}
MEM_MB=${STUDY_SLURM_MEM_MB:-4096}
MPI=${STUDY_SLURM_MPI:-none}
ACCOUNTING=${STUDY_SLURM_ACCOUNTING:-0}
DB_PORT=${STUDY_SLURM_DB_PORT:-3307}
DBD_CONF=/etc/slurm/slurmdbd.conf
CONF=/etc/slurm/slurm.conf
MARK="# written by cpu-train-study tests/slurm/cluster.sh"
NET=10.231.7          # the private bridge's /24: .1 the controller, .11, .12, ... the nodes
BRIDGE=studyslurm0
HOSTS_MARK="# cpu-train-study test cluster"
CLUSTER_NAME=study-test  # (its jobs carry it: SLURM_CLUSTER_NAME, see job_pids)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

refuse() { echo "cluster.sh: state folder $DIR: $*; refusing it (STUDY_SLURM_DIR)" >&2; exit 1; }

# The state folder: made here (0700), or one of ours: a real folder (not a link), owned
# by whoever runs this, that neither group nor others can write.
state_dir() {
    [[ $DIR =~ ^/[A-Za-z0-9._/-]+$ ]] || refuse "not an absolute path (of letters, digits and . _ - /)"
    if [ ! -e "$DIR" ] && [ ! -L "$DIR" ] && [ "${1:-}" = make ]; then
        mkdir -m 0700 -- "$DIR" 2>/dev/null || true  # (someone else's, made meanwhile: refused below)
    fi
    [ -e "$DIR" ] || [ -L "$DIR" ] || return 1
    { [ -L "$DIR" ] || [ ! -d "$DIR" ]; } && refuse "a link or not a folder"
    local owner mode
    owner=$(stat -c %u -- "$DIR")
    mode=$(stat -c %a -- "$DIR")
    [ "$owner" = "$(id -u)" ] || refuse "owned by uid $owner, not by you"
    (( (8#$mode & 8#022) == 0 )) || refuse "group or others can write it (mode $mode)"
    return 0
}

install_packages() {
    local pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux)
    [ "$ACCOUNTING" = 1 ] && pkgs+=(slurmdbd mariadb-server)
    # srun --mpi=pmix, whatever MpiDefault: Debian's mpi_pmix plugin opens the
    # unversioned libpmix.so, which only the -dev package has ("pmi/pmix: can not load
    # PMIx library" without it)
    pkgs+=(libpmix-dev)
    bash "$(dirname "${BASH_SOURCE[0]}")/../install.sh" --no-recommends "${pkgs[@]}"
}

made() { echo "$*" >>"$DIR/made"; }

node_name() { echo "study-node$1"; }
# the controller's name: slurmctld and slurmdbd run with it as their hostname (a UTS
# namespace of their own, this machine's network), so that they bind to its address
# on the bridge alone (CommunicationParameters), not to every address of the machine
CTL=study-ctl
as_controller() { $SUDO unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$CTL" "$@"; }
DB=study-db
DB_NS=studyslurm-db
in_db_ns() {
    $SUDO nsenter --net="/run/netns/$DB_NS" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$DB" "$@"
}
node_ns() { echo "studyslurm-n$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }

start_munge() {
    if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null >/dev/null 2>&1; then
        return  # a munged that answers: use it (it is not ours to stop)
    fi
    $SUDO mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    [ -s /etc/munge/munge.key ] || $SUDO mungekey --create --keyfile=/etc/munge/munge.key
    $SUDO chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    $SUDO chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    $SUDO chmod 0400 /etc/munge/munge.key
    $SUDO chmod 0755 /run/munge
    $SUDO runuser -u munge -- munged --pid-file="/run/munge/munged.pid" --force
    made "pid munged $(cat /run/munge/munged.pid)"
}

# The CPUs of node i (1-based): the machine's CPUs split evenly, each node a block of
# its own; with fewer CPUs than nodes, the nodes share them.
node_cpus() {
    local cpus=($(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))'))
    local n=${#cpus[@]} per=$((${#cpus[@]} / NODES))
    if ((per < 1)); then echo "${cpus[*]}" | tr ' ' ','; return; fi
    echo "${cpus[@]:$((($1 - 1) * per)):$per}" | tr ' ' ','
}

make_network() {
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        echo "cluster.sh: the bridge $BRIDGE exists already (another test cluster?)" >&2
        exit 1
    fi
    $SUDO ip link add "$BRIDGE" type bridge && made "link $BRIDGE"
    $SUDO ip addr add "$NET.1/24" dev "$BRIDGE"
    $SUDO ip link set "$BRIDGE" up
    local i ns
    for i in $(seq "$NODES"); do
        ns=$(node_ns "$i")
        $SUDO ip netns add "$ns" && made "netns $ns"
        $SUDO ip link add "studyslurm-v$i" type veth peer name eth0 netns "$ns"
        made "link studyslurm-v$i"
        $SUDO ip link set "studyslurm-v$i" master "$BRIDGE" up
        $SUDO ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
        $SUDO ip -n "$ns" link set lo up
        $SUDO ip -n "$ns" link set eth0 up
        $SUDO ip -n "$ns" route add default via "$NET.1"
        # the machine's name servers are unreachable from a node (nothing forwards its
        # packets), so a lookup there fails at once instead of after the resolver's
        # timeout: c10d's store looks up each client's address, torchrun its own host's
        # (10 s each here, 10-20 s of every distributed trial's setup)
        local server
        for server in $(awk '$1 == "nameserver" {print $2}' /etc/resolv.conf); do
            case $server in
                127.* | ::1) ;;  # (the node's own loopback: refused at once already)
                *) $SUDO ip -n "$ns" route add unreachable "$server" || true ;;
            esac
        done
    done
    if [ "$ACCOUNTING" = 1 ]; then  # the database's own namespace, on the bridge
        $SUDO ip netns add "$DB_NS" && made "netns $DB_NS"
        $SUDO ip link add studyslurm-vdb type veth peer name eth0 netns "$DB_NS"
        made "link studyslurm-vdb"
        $SUDO ip link set studyslurm-vdb master "$BRIDGE" up
        $SUDO ip -n "$DB_NS" addr add "$NET.2/24" dev eth0
        $SUDO ip -n "$DB_NS" link set lo up
        $SUDO ip -n "$DB_NS" link set eth0 up
    fi
    # the nodes' names, for every process on the machine (the filesystem is shared)
    {
        echo "$NET.1 $CTL $HOSTS_MARK $DIR"
        [ "$ACCOUNTING" = 1 ] && echo "$NET.2 $DB $HOSTS_MARK $DIR"
        for i in $(seq "$NODES"); do echo "$(node_addr "$i") $(node_name "$i") $HOSTS_MARK $DIR"; done
    } | $SUDO tee -a /etc/hosts >/dev/null
    made "hosts $DIR"
}

write_conf() {
    local i nodes="" names=""
    for i in $(seq "$NODES"); do
        local cpus
        cpus=$(node_cpus "$i" | tr ',' '\n' | wc -l)
        nodes+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$cpus RealMemory=$MEM_MB State=UNKNOWN"$'\n'
        names+="${names:+,}$(node_name "$i")"
    done
    $SUDO mkdir -p -m 0755 /etc/slurm
    $SUDO tee "$CONF" >/dev/null <<CONF
$MARK
# state directory: $DIR
ClusterName=$CLUSTER_NAME
SlurmctldHost=$CTL($NET.1)
# slurmctld listens on the bridge's address alone (its name's), not on every address of
# the machine; each slurmd has its node's namespace alone
CommunicationParameters=NoCtldInAddrAny
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
# task/none: each node's CPUs are those its slurmd was started on (taskset), which every
# job there inherits. (task/affinity would bind a task to SLURM's CPU 0 of its node,
# which on study-node2 is this machine's CPU 0, its neighbour's.)
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=$MPI
ReturnToService=2
SchedulerType=sched/backfill
# a backfill pass every 5 s (default 30): what it plans for a waiting job, and the
# "planned" mark it leaves on a node, last no longer than that
SchedulerParameters=bf_interval=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
# each node's temporary filesystem (the nodes share this machine's /tmp): pmix makes its
# step folders there (spmix_appdir_<uid>_<job>.<step>), which two nodes of one step
# would otherwise both create in /tmp ("File exists")
TmpFS=$DIR/tmp-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
$(accounting_conf)
# memory is enforced: a step over its job's memory is killed (polled every second)
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
# squeue still sees finished jobs for 5 minutes (the executor plugin's squeue status)
MinJobAge=300
KillWait=10
${nodes}PartitionName=study Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

accounting_conf() {
    if [ "$ACCOUNTING" = 1 ]; then
        # slurmdbd in its own namespace on the bridge, which the controller reaches
        printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" \
            "AccountingStorageHost=$NET.2" "AccountingStoragePort=6819"
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
}

# Accounting: a MariaDB server of this cluster's own (its data directory under $DIR, its
# own port and socket, stopped with the rest), slurmdbd over it, the cluster registered.
# Both run in a network namespace of their own on the bridge ($DB at $NET.2): MariaDB
# listens on that namespace's loopback alone, slurmdbd (which binds every address it
# has) on the bridge alone.
start_accounting() {
    local data="$DIR/mysql" sock="$DIR/mysql.sock"
    $SUDO rm -rf "$data" && $SUDO mkdir -p "$data"
    $SUDO mariadb-install-db --datadir="$data" --user=root --skip-test-db \
        --auth-root-authentication-method=socket >"$DIR/mariadb-install.log" 2>&1
    in_db_ns sh -c "mariadbd --datadir='$data' --user=root --port=$DB_PORT --bind-address=127.0.0.1 \
        --socket='$sock' --pid-file='$DIR/mariadbd.pid' --log-error='$DIR/mariadbd.log' \
        --skip-name-resolve >/dev/null 2>&1 &"
    for _ in $(seq 80); do [ -S "$sock" ] && [ -s "$DIR/mariadbd.pid" ] && break; sleep 0.25; done
    if [ ! -s "$DIR/mariadbd.pid" ]; then
        echo "cluster.sh: mariadbd did not start:" >&2; tail -n 20 "$DIR/mariadbd.log" >&2 || true
        return 1
    fi
    made "pid mariadbd $(cat "$DIR/mariadbd.pid")"
    # a password of this start's own (hex: nothing for SQL or the conf to interpret)
    local pass
    pass=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    $SUDO mariadb --socket="$sock" -u root -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY \
        '$pass'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
    made "conf $DBD_CONF"
    $SUDO tee "$DBD_CONF" >/dev/null <<DBD
$MARK
# state directory: $DIR
AuthType=auth/munge
DbdHost=$DB
DbdAddr=$NET.2
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/slurmdbd.log
DBD
    in_db_ns slurmdbd
    for _ in $(seq 40); do [ -s "$DIR/slurmdbd.pid" ] && break; sleep 0.25; done
    if [ ! -s "$DIR/slurmdbd.pid" ]; then
        echo "cluster.sh: slurmdbd did not start:" >&2; tail -n 20 "$DIR/slurmdbd.log" >&2 || true
        return 1
    fi
    made "pid slurmdbd $(cat "$DIR/slurmdbd.pid")"
    for _ in $(seq 80); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.25; done
    $SUDO sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null 2>&1 || true
}

node_states() { sinfo -h -N -p study -o "%N %T" 2>/dev/null; }
# sinfo's states of a node that answers: free (idle, or planned: held empty by the
# backfill scheduler for a waiting job, a mark that stays until its next pass, also
# after that job has run), or in use (a "-" suffix: planned as well). A "*" suffix (not
# responding) or any other state is not up.
UP_IDLE=' (idle|planned)$'
UP=' (idle|planned|mixed|allocated|completing)-?$'

ours() {  # the running cluster is this directory's
    [ -e "$CONF" ] && grep -qF "$MARK" "$CONF" && grep -qxF "# state directory: $DIR" "$CONF"
}

start() {
    state_dir make || refuse "cannot be made"
    if [ -e "$CONF" ]; then
        if ! grep -qF "$MARK" "$CONF"; then
            echo "cluster.sh: $CONF exists and was not written by this script; refusing to touch it" >&2
        else
            echo "cluster.sh: a test cluster runs already ($(grep '^# state directory' "$CONF")); stop it first" >&2
        fi
        exit 1
    fi
    install_packages
    $SUDO mkdir -p "$DIR/state"
    $SUDO rm -f "$DIR"/*.log "$DIR/made"
    made "conf $CONF"
    write_conf
    $SUDO chmod 644 "$CONF"  # SLURM's commands read it as any user; it holds no secret
    start_munge
    make_network
    if [ "$ACCOUNTING" = 1 ] && ! start_accounting; then
        stop
        exit 1
    fi
    as_controller slurmctld -i
    made "pid slurmctld $(cat "$DIR/slurmctld.pid")"
    local i name
    for i in $(seq "$NODES"); do
        name=$(node_name "$i")
        $SUDO mkdir -p "$DIR/spool-$name" "$DIR/tmp-$name"
        # its own hostname (a new UTS namespace) and network, on its own CPUs (nsenter,
        # not `ip netns exec`, which mounts a /sys without the cgroup tree slurmd needs)
        $SUDO nsenter --net="/run/netns/$(node_ns "$i")" unshare --uts -- \
            taskset -c "$(node_cpus "$i")" sh -c "hostname $name && exec slurmd -N $name" || true
        for _ in $(seq 20); do [ -s "$DIR/slurmd-$name.pid" ] && break; sleep 0.25; done
        if [ ! -s "$DIR/slurmd-$name.pid" ]; then
            echo "cluster.sh: slurmd of $name did not start:" >&2
            tail -n 20 "$DIR/slurmd-$name.log" >&2 || true
            stop
            exit 1
        fi
        made "pid slurmd $(cat "$DIR/slurmd-$name.pid")"
    done
    local states=""
    for _ in $(seq 90); do
        states=$(node_states)
        if [ "$(echo "$states" | grep -cE "$UP_IDLE")" = "$NODES" ]; then
            echo "cluster.sh: nodes up: $(echo "$states" | tr '\n' ' ')($(sinfo -h -N -p study -o '%N %c CPUs %m MB' | tr '\n' ';')), logs in $DIR"
            return 0
        fi
        if echo "$states" | grep -qE ' (down|drain)'; then
            $SUDO scontrol update nodename="$(echo "$states" | awk '/ (down|drain)/ {print $1}' | paste -sd,)" \
                state=resume >/dev/null 2>&1 || true
        fi
        sleep 0.5
    done
    echo "cluster.sh: the nodes did not come up (states: ${states:-none}); see $DIR/*.log" >&2
    tail -n 20 "$DIR"/slurm*.log >&2 || true
    stop
    exit 1
}

# Every node up (idle, held for a waiting job, in use, or ending a job: $UP), within 10 s: right after a job ends,
# sinfo can list a node in a passing state (or not answer) for a moment. Otherwise the
# states it saw, on stderr.
status() {
    state_dir >/dev/null || return 1
    local states=""
    for _ in $(seq 20); do
        states=$(node_states)
        [ "$(echo "$states" | grep -cE "$UP")" = "$NODES" ] && return 0
        sleep 0.5
    done
    echo "cluster.sh: not every node is up (states: $(echo "${states:-none}" | tr '\n' ' '))" >&2
    return 1
}

# The /etc/hosts lines of this state folder's nodes (fixed-string match, written back
# in place: /etc/hosts may be a bind mount)
remove_hosts_lines() {
    grep -qF -- " $HOSTS_MARK $DIR" /etc/hosts || return 0
    grep -vF -- " $HOSTS_MARK $DIR" /etc/hosts >"$DIR/hosts.new" || true
    $SUDO cp -- "$DIR/hosts.new" /etc/hosts
    rm -f -- "$DIR/hosts.new"
}

stop_pid() {  # pid [name]: TERM, then KILL after 10 s; only while it is still that program
    local pid=$1 name=${2:-}
    kill -0 "$pid" 2>/dev/null || return 0
    # a pid of ours that ended long ago may be someone else's now
    if [ -n "$name" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then return 0; fi
    $SUDO kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
    $SUDO kill -9 "$pid" 2>/dev/null || true
}

# The job steps our slurmd daemons started (children of theirs), to end with them.
step_pids() {
    local pid
    for pid in $(awk '$1 == "pid" && $2 == "slurmd" && $3 ~ /^[0-9]+$/ {print $3}' "$DIR/made" 2>/dev/null); do
        pgrep -P "$pid" 2>/dev/null || true
    done
}

# Processes of this cluster's jobs, by the name only its jobs carry in their environment
# (SLURM_CLUSTER_NAME): proctrack/linuxproc follows a step's processes by descent and
# loses one whose parent ended first, which then outlives its job (a job's inner
# snakemake, stuck after SLURM's SIGTERM at a time limit, once in two suite runs here).
job_pids() {
    $SUDO grep -lzxF "SLURM_CLUSTER_NAME=$CLUSTER_NAME" /proc/[0-9]*/environ 2>/dev/null |
        sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' || true
}

stop() {
    if ! state_dir || [ ! -f "$DIR/made" ]; then
        echo "cluster.sh: nothing started from $DIR"
        return 0
    fi
    if ours; then
        # the jobs first (their steps and processes), while the daemons can still do it
        timeout 10 scancel --partition=study >/dev/null 2>&1 || true
        for _ in $(seq 40); do
            [ -z "$(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    local steps
    steps=$(step_pids)
    local kind what rest
    # in the reverse order of their making; each entry only if it is of the kind and
    # name this script gives (the list is data: nothing of it is run or interpreted)
    tac "$DIR/made" | while read -r kind what rest; do
        case "$kind" in
        pid)
            if [[ $what =~ ^(munged|slurmctld|slurmd|slurmdbd|mariadbd)$ && $rest =~ ^[0-9]+$ ]]; then
                stop_pid "$rest" "$what"
            fi ;;
        netns)
            if [[ $what =~ ^studyslurm-(n[0-9]+|db)$ ]]; then
                $SUDO ip netns delete "$what" 2>/dev/null || true
            fi ;;
        link)
            if [[ $what =~ ^studyslurm(0|-v[0-9]+|-vdb)$ ]]; then
                $SUDO ip link delete "$what" 2>/dev/null || true
            fi ;;
        hosts) remove_hosts_lines ;;
        conf)
            if [[ $what == "$CONF" || $what == "$DBD_CONF" ]] && [ -e "$what" ] &&
                grep -qxF "# state directory: $DIR" "$what"; then $SUDO rm -f "$what"; fi ;;
        esac
    done
    # steps whose slurmd ended before them (started by our daemons, nobody else's)
    for pid in $steps; do stop_pid "$pid" slurmstepd; done
    # and what of the jobs outlived both: its job has ended, it was signalled already
    for pid in $(job_pids); do $SUDO kill -9 "$pid" 2>/dev/null || true; done
    $SUDO rm -f "$DIR/made"
    echo "cluster.sh: stopped"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
