#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
exec "${PYTHON:-python3}" -m pytest tests -ra --durations=15 "$@"
