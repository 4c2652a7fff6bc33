#!/usr/bin/env bash
# Check an install before a long job (tools/selftest.py): the multi-rank
# tests on the device, a short AMP fine-tune of CO-DINO, RT-DETRv2, D-FINE
# and DEIM on 2 ranks with loss and COCO mAP, and the port-vs-upstream
# benchmarks where DFINE_UPSTREAM / CODETR_UPSTREAM / RTDETR_UPSTREAM are
# set. One table at the end, a JSON file, exit status 1 if a check failed.
#
#   bash tools/selftest.sh [--setup] [--device cpu|cuda] [--quick] \
#       [--work-dir DIR] [--json PATH] [--only CHECK ...] [--break CHECK]
#
# --setup runs tools/setup_env.sh first (as tools/demo.sh does); without
# it the installed environment is what gets checked.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ARGS=()
for arg in "$@"; do
    if [ "$arg" = "--setup" ]; then
        bash tools/setup_env.sh
    else
        ARGS+=("$arg")
    fi
done
exec "${PYTHON:-python3}" tools/selftest.py "${ARGS[@]+"${ARGS[@]}"}"
