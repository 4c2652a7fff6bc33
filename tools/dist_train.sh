#!/usr/bin/env bash
# Train on NPROC ranks per node with torchrun (gloo on CPU, nccl on GPUs).
#
#   bash tools/dist_train.sh CONFIG NPROC [train.py args...]
#
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
# PORT (a free port on one node; on several, the Slurm job's own port, else
# 29500), PYTHON (python3), MAX_RESTARTS (0: torchrun's --max-restarts; a
# restarted run resumes from its latest checkpoint).
DIST_NAME=dist_train.sh exec bash "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh" \
    train.py "$@"
