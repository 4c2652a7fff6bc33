#!/usr/bin/env bash
# Evaluate a checkpoint on NPROC ranks per node with torchrun.
#
#   bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py args...]
#
# Environment: as tools/dist_train.sh.
set -euo pipefail
if [ "$#" -lt 3 ]; then
    echo "dist_test.sh: CONFIG, CHECKPOINT and NPROC are required." \
         "usage: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC" \
         "[test.py args...]" >&2
    exit 2
fi
CONFIG="$1"
CHECKPOINT="$2"
NPROC="$3"
DIST_NAME=dist_test.sh exec bash "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh" \
    test.py "$CONFIG" "$NPROC" "$CHECKPOINT" "${@:4}"
