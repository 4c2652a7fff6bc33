#!/usr/bin/env bash
# Evaluate a checkpoint with one Slurm task per rank (MMDetection's
# slurm_test.sh interface; tools/slurm_launch.sh does the work).
#
#   [GPUS=8] bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT \
#       [test.py args...]
#
# runs: srun ... $PYTHON -u tools/test.py CONFIG CHECKPOINT --launcher=slurm
# Environment and the --gres rule: as tools/slurm_train.sh.
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "slurm_test.sh: PARTITION, JOB_NAME, CONFIG and CHECKPOINT are" \
         "required. usage: bash tools/slurm_test.sh PARTITION JOB_NAME" \
         "CONFIG CHECKPOINT [test.py args...]" >&2
    exit 2
fi
SLURM_NAME=slurm_test.sh SLURM_LEAD_NAME=CHECKPOINT exec bash \
    "$(dirname "${BASH_SOURCE[0]}")/slurm_launch.sh" test.py "$@"
