#!/usr/bin/env bash
# Train with one Slurm task per rank (MMDetection's slurm_train.sh
# interface; tools/slurm_launch.sh does the work).
#
#   [GPUS=8] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR \
#       [train.py args...]
#
# runs: srun -p PARTITION --job-name=JOB_NAME --ntasks=GPUS
#   --ntasks-per-node=GPUS_PER_NODE --cpus-per-task=CPUS_PER_TASK
#   --kill-on-bad-exit=1 [--gres=gpu:GPUS_PER_NODE] $SRUN_ARGS
#   $PYTHON -u tools/train.py CONFIG --work-dir=WORK_DIR --launcher=slurm ...
#
# Environment: GPUS (8), GPUS_PER_NODE (min(GPUS, 8)), CPUS_PER_TASK (5),
# SRUN_ARGS (''), PYTHON (python3), OMP_NUM_THREADS (1).
# --gres is requested only where the partition's nodes offer GPUs. On a CPU
# partition GPUS counts tasks (gloo ranks), and CPUS_PER_TASK must fit the
# nodes' cores: e.g. GPUS=2 CPUS_PER_TASK=1 SRUN_ARGS=--overcommit on a
# 2-core node. For a job that survives preemption (requeue and resume) see
# tools/slurm_batch_example.sh.
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "slurm_train.sh: PARTITION, JOB_NAME, CONFIG and WORK_DIR are" \
         "required. usage: bash tools/slurm_train.sh PARTITION JOB_NAME" \
         "CONFIG WORK_DIR [train.py args...]" >&2
    exit 2
fi
SLURM_NAME=slurm_train.sh SLURM_LEAD_NAME=WORK_DIR exec bash \
    "$(dirname "${BASH_SOURCE[0]}")/slurm_launch.sh" train.py \
    "$1" "$2" "$3" --work-dir="$4" "${@:5}"
