#!/usr/bin/env bash
# An example batch script for your own sbatch: a training job that is
# requeued, not lost, when its time runs out or it is preempted. Copy it
# and adapt the #SBATCH lines to your cluster; options given to sbatch
# override them.
#
#   cd /path/to/mmddp_ext   # sbatch runs a copy of this script; the job
#                           # starts in the directory sbatch is called from
#   sbatch tools/slurm_batch_example.sh CONFIG WORK_DIR [train.py args...]
#   # on the one-node test cluster (2 cores, no GPUs):
#   sbatch --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --overcommit \
#       tools/slurm_batch_example.sh CONFIG WORK_DIR
#
# One Slurm task per rank, as tools/slurm_train.sh: --launcher slurm, and
# ExtRunner takes rank, world size, local rank, master address and a port
# of the job's own from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the
# step's node list and SLURM_JOB_ID (docs/cluster.md).
#
# How a job survives its end:
# 1. --signal=USR1@120: about 120 s before the time limit (Slurm checks
#    limits periodically, so up to a minute early or late) Slurm sends
#    SIGUSR1 to every process of the job's steps: the train.py ranks that
#    srun started. Not 'B:USR1@120': B: signals only this batch shell,
#    which runs srun in the foreground and would not pass it on in time.
#    A preemption (PreemptMode=REQUEUE) or scancel sends SIGTERM instead.
# 2. On SIGUSR1 or SIGTERM the runner saves a checkpoint at the next
#    iteration boundary; after SIGUSR1 it runs 'scontrol requeue
#    $SLURM_JOB_ID' (not after SIGTERM: scancel means stop, and Slurm
#    requeues a job it preempts itself). Slurm
#    then ends the job at once (SIGTERM, SIGKILL KillWait later) and
#    queues it again; it may start after AuthInfo cred_expire (120 s by
#    default), from the top of this script, with SLURM_RESTART_COUNT=1, 2..
# 3. The restarted train.py resumes by itself from that checkpoint in
#    WORK_DIR (SLURM_RESTART_COUNT makes it a restart of the same run),
#    exactly where it stopped, mid-epoch too. --open-mode=append keeps
#    every run's log in one file.
#
#SBATCH --job-name=mmddp_train
#SBATCH --ntasks=8
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=5
# GPU partitions: one GPU per task (drop the extra '#' to ask for them).
##SBATCH --gres=gpu:8
#SBATCH --requeue
#SBATCH --signal=USR1@120
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "slurm_batch_example.sh: CONFIG and WORK_DIR are required." \
         "usage: sbatch tools/slurm_batch_example.sh CONFIG WORK_DIR" \
         "[train.py args...]" >&2
    exit 2
fi
CONFIG="$1"
WORK_DIR="$2"
if [ ! -f tools/train.py ]; then
    echo "slurm_batch_example.sh: no tools/train.py in $PWD: submit from" \
         "the repository root (the job starts where sbatch was called)." >&2
    exit 2
fi
: "${SLURM_JOB_ID:?slurm_batch_example.sh: submit it with sbatch}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "slurm_batch_example.sh: job $SLURM_JOB_ID, run" \
     "$((${SLURM_RESTART_COUNT:-0} + 1)), on $SLURM_JOB_NODELIST"

srun --kill-on-bad-exit=1 "${PYTHON:-python3}" -u tools/train.py "$CONFIG" \
    --work-dir "$WORK_DIR" --launcher slurm "${@:3}"

# The alternative: one torchrun per node (tools/dist_train.sh) instead of
# one task per rank. Ask for one task per node holding all its cores
# (--ntasks-per-node=1, --cpus-per-task=<the node's cores>, --gres=gpu:8),
# set NPROC_PER_NODE to the ranks per node and replace the srun above by:
#
# NPROC_PER_NODE=8
# export NNODES="$SLURM_NNODES"
# export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" |
#     head -n1)"
# # PORT: dist_train.sh takes one of the job's own by itself.
# # NODE_RANK differs per node, so the task itself reads SLURM_NODEID.
# # Slurm's SIGUSR1 goes to every process of the step, torchrun included,
# # which dies of it unless it ignores it: tools/dist_launch.sh starts it
# # so. Exec, and no 'trap "" USR1' here: a signal ignored when a shell
# # starts cannot be trapped in it, and dist_launch.sh traps USR1.
# srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
#     bash -c 'NODE_RANK="$SLURM_NODEID" exec bash tools/dist_train.sh "$@"' \
#     dist_train "$CONFIG" "$NPROC_PER_NODE" --work-dir "$WORK_DIR" "${@:3}"
