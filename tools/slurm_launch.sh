#!/usr/bin/env bash
# Shared launcher of the slurm_train and slurm_test scripts: runs
# tools/SCRIPT as GPUS Slurm tasks with srun, each task one rank
# (--launcher=slurm: ExtRunner reads SLURM_PROCID, SLURM_NTASKS and the
# node list). The interface and defaults are MMDetection 3.x's.
#
#   bash tools/slurm_launch.sh SCRIPT PARTITION JOB_NAME CONFIG LEAD \
#       [SCRIPT args...]
#
# LEAD is the argument that follows CONFIG on SCRIPT's command line
# (train.py: --work-dir=WORK_DIR; test.py: CHECKPOINT).
#
# Environment: GPUS (8), GPUS_PER_NODE (min(GPUS, 8)), CPUS_PER_TASK (5),
# SRUN_ARGS (''), PYTHON (python3). The script asks Slurm which generic
# resources the partition's nodes offer (sinfo -o %G) and requests
# --gres=gpu:GPUS_PER_NODE only where they offer GPUs; on a partition
# without GPUs nothing is requested and GPUS counts tasks (CPU ranks, gloo).
set -euo pipefail

SCRIPT="${1:?slurm_launch.sh: SCRIPT (train.py or test.py) is required}"
shift
NAME="${SLURM_NAME:-slurm_launch.sh}"
LEAD_NAME="${SLURM_LEAD_NAME:-LEAD}"
usage="usage: bash tools/$NAME PARTITION JOB_NAME CONFIG $LEAD_NAME"
usage+=" [$SCRIPT args...]"
if [ "$#" -lt 4 ] || [ -z "$1" ] || [ -z "$2" ] || [ -z "$3" ] \
    || [ -z "$4" ]; then
    echo "$NAME: PARTITION, JOB_NAME, CONFIG and $LEAD_NAME are required." \
         "$usage" >&2
    exit 2
fi
PARTITION="$1"
JOB_NAME="$2"
CONFIG="$3"
LEAD="$4"
# checked once here, before srun starts any task
# shellcheck source=launch_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_checks.sh"
check_config "$NAME" "$CONFIG" "$usage"

GPUS="${GPUS:-8}"
if [[ "$GPUS" =~ ^[1-9][0-9]*$ ]] && [ "$GPUS" -lt 8 ]; then
    GPUS_PER_NODE="${GPUS_PER_NODE:-$GPUS}"
else
    GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
fi
CPUS_PER_TASK="${CPUS_PER_TASK:-5}"
for var in GPUS GPUS_PER_NODE CPUS_PER_TASK; do
    if ! [[ "${!var}" =~ ^[1-9][0-9]*$ ]]; then
        echo "$NAME: $var must be a positive integer, got '${!var}'." \
             "(GPUS: tasks in all, one rank each; GPUS_PER_NODE: tasks per" \
             "node; CPUS_PER_TASK: cores per task)" >&2
        exit 2
    fi
done
read -r -a EXTRA_SRUN_ARGS <<< "${SRUN_ARGS:-}"

for command in sinfo srun; do
    if ! command -v "$command" >/dev/null; then
        echo "$NAME: $command not found: run this where Slurm's client" \
             "commands are installed (a login node)." >&2
        exit 2
    fi
done
# Generic resources of the partition's nodes, one line per node
# configuration: '(null)' when none, e.g. 'gpu:8' or 'gpu:a100:4(S:0-1)'.
if ! NODE_GRES="$(sinfo -h -p "$PARTITION" -o %G)"; then
    echo "$NAME: sinfo could not reach Slurm (on a test machine:" \
         "eval \"\$(bash tools/slurm_cluster.sh start)\" sets SLURM_CONF)." >&2
    exit 1
fi
if [ -z "$NODE_GRES" ]; then
    echo "$NAME: partition '$PARTITION' has no nodes (sinfo -p" \
         "$PARTITION lists none); the partitions here: $(sinfo -h -o %P |
         tr '\n' ' ')" >&2
    exit 2
fi
GRES=()
if grep -Eq '(^|,)gpu([:(]|$)' <<< "$NODE_GRES"; then
    GRES=(--gres="gpu:$GPUS_PER_NODE")
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# One compute thread per rank unless the user says otherwise: ranks share
# the node's cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

COMMAND=(srun -p "$PARTITION" --job-name="$JOB_NAME"
         --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE"
         --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1
         "${GRES[@]}" "${EXTRA_SRUN_ARGS[@]}"
         "${PYTHON:-python3}" -u "$ROOT/tools/$SCRIPT" "$CONFIG" "$LEAD"
         --launcher=slurm "${@:5}")
echo "$NAME: $(printf '%q ' "${COMMAND[@]}")" >&2
exec "${COMMAND[@]}"
