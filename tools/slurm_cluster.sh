#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests and for trying
# tools/slurm_train.sh, slurm_test.sh and slurm_batch_example.sh by hand.
# Needs root (munged, slurmctld and slurmd run as root) and Debian's
# slurm-wlm and munge packages (tools/setup_env.sh installs them).
#
#   eval "$(bash tools/slurm_cluster.sh start)"  # prints export SLURM_CONF=
#   bash tools/slurm_cluster.sh status   # exit 0: the cluster answers
#   bash tools/slurm_cluster.sh stop     # slurmd, slurmctld (not munged)
#
# The Slurm commands find this cluster only through SLURM_CONF: the conf
# lives in the state dir, not in /etc/slurm, so every shell that runs
# sinfo/srun/sbatch/scontrol needs SLURM_CONF=$MMDDP_EXT_SLURM_DIR/slurm.conf
# (start prints the export line on stdout; everything else goes to stderr).
# Jobs inherit it, so scontrol inside a job finds the cluster too.
#
# Environment:
#   MMDDP_EXT_SLURM_DIR (/tmp/mmddp_ext_slurm): slurm.conf, state, spool, logs
#   MMDDP_EXT_SLURM_WAIT (60): seconds start waits for an idle node
#   MMDDP_EXT_SLURM_REQUEUE_DELAY (20): AuthInfo cred_expire, the lifetime
#       of a job step's credential and also how long a requeued job waits
#       before it may start again: a requeue takes this + 3 s here (Slurm's
#       defaults, 120 s and a 60 s scheduler pass, made it ~150 s)
#
# Start is idempotent: a cluster that already answers is kept as it is.
# Exit codes: 0 done, 1 a daemon failed (its log tail is printed), 2 usage,
# 3 this machine cannot run a test Slurm (not root, packages missing).
set -euo pipefail

NAME=slurm_cluster.sh
DIR="${MMDDP_EXT_SLURM_DIR:-/tmp/mmddp_ext_slurm}"
CONF="$DIR/slurm.conf"
WAIT_S="${MMDDP_EXT_SLURM_WAIT:-60}"
REQUEUE_DELAY="${MMDDP_EXT_SLURM_REQUEUE_DELAY:-20}"
export SLURM_CONF="$CONF"
# Debian keeps the daemons in /usr/sbin, which a non-login PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

say() { echo "$NAME: $*" >&2; }
unavailable() { echo "$NAME: $*" >&2; exit 3; }

usage() {
    echo "usage: bash tools/$NAME start|stop|status" >&2
    exit 2
}

for var in MMDDP_EXT_SLURM_WAIT MMDDP_EXT_SLURM_REQUEUE_DELAY; do
    if ! [[ "${!var:-1}" =~ ^[1-9][0-9]*$ ]]; then
        echo "$NAME: $var must be a positive integer (seconds), got" \
             "'${!var}'." >&2
        exit 2
    fi
done

check_binaries() {
    local binary
    for binary in munged slurmctld slurmd sinfo srun sbatch scontrol; do
        command -v "$binary" >/dev/null || unavailable "$binary not" \
            "found: apt-get install slurm-wlm munge (tools/setup_env.sh" \
            "does it as root)"
    done
}

# answers: slurmctld replies and the node can take jobs.
answers() {
    # sinfo takes ~10 s to give up on a dead slurmctld: ask the pids first.
    daemon_alive slurmctld && daemon_alive slurmd || return 1
    local state
    state="$(timeout 10 sinfo -h -o %T 2>/dev/null | head -n1)" || return 1
    [[ "$state" =~ ^(idle|mixed|allocated|completing) ]]
}

log_tails() {
    local log
    for log in "$DIR"/log/*.log; do
        [ -f "$log" ] || continue
        echo "---- last lines of $log" >&2
        tail -n 15 "$log" >&2
    done
}

fail() {
    say "ERROR: $*"
    log_tails
    exit 1
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        if ! mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null; then
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 \
                status=none
        fi
    fi
    # munged refuses a key, socket dir or log dir that someone else owns.
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 755 /run/munge
    if timeout 10 munge -n 2>/dev/null | timeout 10 unmunge >/dev/null 2>&1
    then
        return
    fi
    say "starting munged"
    runuser -u munge -- munged || fail "munged did not start"
    local i
    for i in $(seq 20); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            return
        fi
        sleep 0.5
    done
    fail "munged does not answer (munge -n | unmunge)"
}

write_conf() {
    local host cpus mem_mb
    host="$(hostname -s)"
    # nproc alone obeys OMP_NUM_THREADS (pytest's conftest sets 1): a conf
    # with fewer CPUs than slurmd finds never runs 2 tasks per node.
    cpus="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
    # Most of the memory, never more than there is: a RealMemory above the
    # real one drains the node ("Low RealMemory").
    mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
    cat > "$CONF.new" <<EOF
# Written by tools/$NAME: a one-node test cluster. Edits are overwritten.
ClusterName=mmddp_ext
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the wait before a requeued job may start again.
AuthInfo=cred_expire=$REQUEUE_DELAY
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
SlurmUser=root
SlurmdUser=root
ReturnToService=2
JobRequeue=1
# Finished jobs stay visible to 'scontrol show job' this long (no sacct here).
MinJobAge=120
# A released or requeued job starts at the next scheduler pass: keep it short.
SchedulerParameters=sched_interval=5,bf_interval=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP \\
    OverSubscribe=FORCE
EOF
    mv "$CONF.new" "$CONF"
}

# daemon_pid NAME: the pid in its pid file when that process is NAME.
daemon_pid() {
    local pid
    pid="$(cat "$DIR/run/$1.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
    echo "$pid"
}

daemon_alive() { daemon_pid "$1" >/dev/null; }

# stop_daemon NAME: SIGTERM to the pid in its pid file, SIGKILL after 10 s.
stop_daemon() {
    local pid i
    if pid="$(daemon_pid "$1")"; then
        kill "$pid" 2>/dev/null || true
        for i in $(seq 20); do
            [ -d "/proc/$pid" ] || break
            sleep 0.5
        done
        if [ -d "/proc/$pid" ]; then
            say "$1 ($pid) ignored SIGTERM for 10 s, killing it"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$DIR/run/$1.pid"
}

# Another cluster's daemons hold Slurm's ports (6817, 6818): ours would
# exit, and sinfo would get the other cluster's answer.
refuse_other_daemons() {
    local pid
    for pid in $(pgrep -x slurmctld; pgrep -x slurmd); do
        fail "another Slurm daemon runs (pid $pid: $(tr '\0' ' ' \
            < "/proc/$pid/cmdline")); stop it, or use its cluster"
    done
}

wait_for_node() {
    local deadline=$((SECONDS + WAIT_S)) state="" resumed=0
    while [ "$SECONDS" -lt "$deadline" ]; do
        local daemon
        for daemon in slurmctld slurmd; do
            # no pid file yet: still starting (the daemon writes it)
            if [ -f "$DIR/run/$daemon.pid" ] && ! daemon_alive "$daemon"; then
                fail "$daemon exited"
            fi
        done
        state="$(timeout 10 sinfo -h -o %T 2>/dev/null | head -n1)" || state=""
        case "$state" in
            idle* | mixed* | allocated* | completing*) return 0 ;;
            down* | drain*)
                # A node left down by an earlier run that ended abruptly.
                if [ "$resumed" = 0 ]; then
                    timeout 10 scontrol update NodeName="$(hostname -s)" \
                        State=RESUME >/dev/null 2>&1 || true
                    resumed=1
                fi ;;
        esac
        sleep 1
    done
    fail "the node is not idle after $WAIT_S s (sinfo: '${state:-no answer}')"
}

start() {
    check_binaries
    if answers; then
        say "cluster already up ($CONF)"
        echo "export SLURM_CONF=$CONF"
        return
    fi
    [ "$(id -u)" = 0 ] || unavailable "not root: a test Slurm needs root to" \
        "start munged/slurmd"
    local began=$SECONDS
    start_munge
    stop_daemon slurmd
    stop_daemon slurmctld
    refuse_other_daemons
    write_conf
    slurmctld -f "$CONF" || fail "slurmctld did not start"
    slurmd -f "$CONF" || fail "slurmd did not start"
    wait_for_node
    timeout 60 srun --quiet -n 2 --overcommit true \
        || fail "the node is idle but 'srun -n 2 --overcommit true' failed"
    say "cluster up in $((SECONDS - began)) s ($CONF)"
    echo "export SLURM_CONF=$CONF"
}

stop() {
    [ "$(id -u)" = 0 ] || unavailable "not root: only root can stop the" \
        "test Slurm's daemons"
    stop_daemon slurmd
    stop_daemon slurmctld
    say "slurmd and slurmctld stopped (munged left running)"
}

status() {
    check_binaries
    if answers; then
        say "up: $(sinfo -h -o '%P %D %T %C' | head -n1) ($CONF)"
        return 0
    fi
    say "not answering ($CONF)"
    return 1
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) usage ;;
esac
