#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
# Five pytest workers on 2 cores, each taking whole test files (module
# fixtures run once): multi-rank tests leave cores idle while their ranks
# wait on each other, on a launcher, on Slurm or on a timeout they prove
# (2 workers kept the cores 67 % busy: 920 s against 830 s with 3,
# 2026-11-27; 3 workers 934 s, then 4 workers 888 s, back to back,
# 2026-11-28; 4 workers 991 s, then 5 workers 905 s with one doctor case
# fewer (about 25 s), 2026-11-29). PYTEST_WORKERS=0 runs in one process.
WORKERS="${PYTEST_WORKERS:-5}"
PARALLEL=()
if [ "$WORKERS" != 0 ]; then
    # whole files per worker, longest first (tests/file_order.py)
    PARALLEL=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
fi
# Each failing test's traceback is appended here as it happens, so a run
# cut at its time limit still says why (tests/failure_log.py).
export MMDDP_EXT_FAILURE_LOG="${MMDDP_EXT_FAILURE_LOG:-$ROOT/work_dirs/test_failures.log}"
mkdir -p "$(dirname "$MMDDP_EXT_FAILURE_LOG")"
rm -f "$MMDDP_EXT_FAILURE_LOG"
echo "[run_tests] failing tests' tracebacks: $MMDDP_EXT_FAILURE_LOG"
exec "${PYTHON:-python3}" -m pytest tests -ra --durations=15 \
    "${PARALLEL[@]}" "$@"
