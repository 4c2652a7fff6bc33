#!/usr/bin/env bash
# Shared launcher of the dist_train and dist_test scripts: runs
# tools/SCRIPT on NPROC ranks per node with torchrun
# (python -m torch.distributed.run, never the deprecated
# torch.distributed.launch). Works on GPUs (nccl) and on CPU (gloo).
#
#   bash tools/dist_launch.sh SCRIPT CONFIG NPROC [SCRIPT args...]
#
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
# PORT (see below), PYTHON (python3), MAX_RESTARTS (0): how many times torchrun
# restarts every rank after one fails or is killed (--max-restarts);
# train.py then resumes from the latest checkpoint in the work dir.
set -euo pipefail

SCRIPT="${1:?dist_launch.sh: SCRIPT (train.py or test.py) is required}"
shift
NAME="${DIST_NAME:-dist_launch.sh}"
usage="usage: bash tools/$NAME CONFIG NPROC [$SCRIPT args...]"
CONFIG="${1:-}"
NPROC="${2:-}"
if [ -z "$CONFIG" ] || [ -z "$NPROC" ]; then
    echo "$NAME: CONFIG and NPROC are required. $usage" >&2
    exit 2
fi
# checked once here, before any rank starts
# shellcheck source=launch_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_checks.sh"
check_config "$NAME" "$CONFIG" "$usage"
if ! [[ "$NPROC" =~ ^[1-9][0-9]*$ ]]; then
    echo "$NAME: NPROC must be a positive integer (ranks per node)," \
         "got '$NPROC'. $usage" >&2
    exit 2
fi
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
# The rendezvous port, unless PORT names one: on one node a free port, so
# that two runs on a machine never collide on torchrun's 29500; on several
# nodes inside a Slurm job one of the job's own, the same on every node
# (mmddp_ext.launch.environments.slurm_port's formula, which
# tests/test_tools/test_dist_train.py checks); else 29500.
if [ -z "${PORT:-}" ]; then
    if [ "$NNODES" = 1 ]; then
        PORT="$(python3 -c 'import socket; s = socket.socket()
s.bind(("", 0)); print(s.getsockname()[1])')"
    elif [[ "${SLURM_JOB_ID:-}" =~ ^[0-9]+$ ]]; then
        STEP="${SLURM_STEP_ID:-0}"
        [[ "$STEP" =~ ^[0-9]+$ ]] || STEP=0
        PORT=$((12000 + (SLURM_JOB_ID * 16 + STEP % 16) % 17000))
    else
        PORT=29500
    fi
fi
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MAX_RESTARTS="${MAX_RESTARTS:-0}"
if ! [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]]; then
    echo "$NAME: MAX_RESTARTS must be a non-negative integer (restarts" \
         "after a failed rank), got '$MAX_RESTARTS'." >&2
    exit 2
fi
for var in NNODES PORT; do
    if ! [[ "${!var}" =~ ^[1-9][0-9]*$ ]]; then
        echo "$NAME: $var must be a positive integer, got '${!var}'." >&2
        exit 2
    fi
done
if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || [ "$NODE_RANK" -ge "$NNODES" ]; then
    echo "$NAME: NODE_RANK must be in [0, NNODES=$NNODES), got" \
         "'$NODE_RANK'." >&2
    exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# One compute thread per rank unless the user says otherwise: ranks share
# the machine's cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

RENDEZVOUS=(--node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR"
            --master_port="$PORT")
if [ "$MAX_RESTARTS" -gt 0 ]; then
    # Restarted ranks need a fresh store per attempt: the static rendezvous
    # and the c10d one's shared store keep the first attempt's keys, and
    # the new ranks' process group would connect to the dead ones. The
    # c10d rendezvous without store sharing gives every round its own.
    RENDEZVOUS=(--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT"
                --max-restarts="$MAX_RESTARTS")
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi

# Signals a cluster sends before it stops a job reach the ranks, which
# checkpoint at the next iteration boundary (PreemptionHook). torchrun
# itself dies of SIGUSR1 (its default action; pytorch #154849), which Slurm
# sends to every process of a job step (--signal=USR1@N): it starts with
# SIGUSR1 ignored, the ranks install their own handler, and a SIGUSR1 sent
# to this script alone is passed on to them. SIGTERM and SIGINT go to
# torchrun, which passes them on and waits for the ranks.
trap '' USR1
"${PYTHON:-python3}" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --nproc_per_node="$NPROC" \
    "${RENDEZVOUS[@]}" \
    "$ROOT/tools/$SCRIPT" \
    "$CONFIG" \
    --launcher pytorch "${@:3}" &
LAUNCHER_PID=$!
trap 'pkill -USR1 -P "$LAUNCHER_PID" || true' USR1
trap 'kill -TERM "$LAUNCHER_PID" 2>/dev/null || true' TERM
trap 'kill -INT "$LAUNCHER_PID" 2>/dev/null || true' INT
# wait returns early (above 128) when a trapped signal arrives
while true; do
    STATUS=0
    wait "$LAUNCHER_PID" || STATUS=$?
    kill -0 "$LAUNCHER_PID" 2>/dev/null || exit "$STATUS"
done
