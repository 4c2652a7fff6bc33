#!/usr/bin/env bash
# The demo: set up (if needed), generate a ~50%-empty COCO-format dataset,
# train tiny CO-DINO (every branch: DINO query head with denoising, ATSS
# and RPN + RoI auxiliary heads) on 2 ranks with tools/dist_train.sh (gloo
# on CPU when there is no GPU), evaluate COCO bbox mAP, print a summary.
#
#   bash tools/demo.sh [NPROC] [CONFIG]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NPROC="${1:-2}"
CONFIG="${2:-configs/co_dino_tiny.py}"
WORK_DIR="work_dirs/demo"
PY="${PYTHON:-python3}"

bash tools/setup_env.sh
if [ ! -f data/synthetic/train/annotations.json ]; then
    echo "[demo] generating data/synthetic (about half the images empty)"
    "$PY" tools/make_synthetic_coco.py data/synthetic --train 64 --val 16 \
        --empty 0.5
fi
rm -rf "$WORK_DIR"
echo "[demo] training $CONFIG on $NPROC ranks"
start=$(date +%s)
# Loss every 20 iterations: the tiny configs' schedule logs every one.
PORT="${PORT:-29517}" bash tools/dist_train.sh "$CONFIG" "$NPROC" \
    --work-dir "$WORK_DIR" --cfg-options default_hooks.logger.interval=20
echo "[demo] finished in $(( $(date +%s) - start ))s"
"$PY" tools/summarize_run.py "$WORK_DIR"
