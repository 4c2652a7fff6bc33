#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
# Two pytest workers, each taking whole test files (module fixtures run
# once): a multi-rank test leaves cores idle while its ranks wait on each
# other or its launcher starts them. PYTEST_WORKERS=0 runs in one process.
WORKERS="${PYTEST_WORKERS:-2}"
PARALLEL=()
if [ "$WORKERS" != 0 ]; then
    # whole files per worker, longest first (tests/file_order.py)
    PARALLEL=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
fi
exec "${PYTHON:-python3}" -m pytest tests -ra --durations=15 \
    "${PARALLEL[@]}" "$@"
