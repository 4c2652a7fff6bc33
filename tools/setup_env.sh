#!/usr/bin/env bash
# Idempotent environment setup for mmddp_ext on a fresh Debian/Python 3.11
# machine, with or without a GPU. Every step first checks whether it is
# already satisfied, so a second run only verifies and takes seconds.
#
#   bash tools/setup_env.sh            # install what is missing
#   PYTHON=/path/to/python bash tools/setup_env.sh
#
# What it installs when missing:
#   torch==2.13.0 (CPU wheel)   only when no torch is importable; a torch
#                               you installed yourself (e.g. CUDA) is kept
#   setuptools<70, wheel, ninja build tools for the mmcv sdist
#   mmengine, mmcv 2.1.0 (+ops), versions from requirements/pinned.txt
#   mmdet 3.3.0, pycocotools    mmcv is built from the PyPI sdist with
#                               MMCV_WITH_OPS=1 when no wheel installs; pip
#                               caches the built wheel for the next run
#   pytest, pytest-timeout,     (requirements/tests.txt)
#   pytest-xdist
#   mmddp_ext itself            editable install of this checkout
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
PIP=("$PY" -m pip install --disable-pip-version-check)

say() { echo "[setup_env] $*"; }

pinned() {  # pinned NAME -> version from requirements/pinned.txt
    sed -n "s/^$1==\(.*\)$/\1/p" "$ROOT/requirements/pinned.txt"
}

has_dist() {  # has_dist NAME [VERSION_PREFIX]
    "$PY" - "$@" <<'EOF'
import sys
from importlib import metadata
try:
    version = metadata.version(sys.argv[1])
except metadata.PackageNotFoundError:
    sys.exit(1)
prefix = sys.argv[2] if len(sys.argv) > 2 else ''
sys.exit(0 if version.split('+')[0].startswith(prefix) else 1)
EOF
}

say "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')"

if "$PY" -c 'import torch' 2>/dev/null; then
    say "torch $("$PY" -c 'import torch; print(torch.__version__)') present, kept"
else
    say "installing torch==$(pinned torch) (CPU build; bring your own CUDA torch on GPU machines)"
    "${PIP[@]}" "torch==$(pinned torch)"
fi

if ! "$PY" - <<'EOF' 2>/dev/null
from importlib import metadata
from packaging.version import Version
assert Version(metadata.version('setuptools')) < Version('70')
metadata.version('wheel'); metadata.version('ninja')
EOF
then
    say "installing mmcv build tools: $(grep -v '^#' "$ROOT/requirements/build.txt" | tr '\n' ' ')"
    "${PIP[@]}" -r "$ROOT/requirements/build.txt"
else
    say "build tools present"
fi

if has_dist mmengine; then
    say "mmengine $("$PY" -c 'import mmengine; print(mmengine.__version__)') present"
else
    say "installing mmengine==$(pinned mmengine)"
    "${PIP[@]}" "mmengine==$(pinned mmengine)"
fi

if "$PY" -c 'import mmcv, mmcv.ops' 2>/dev/null; then
    say "mmcv $("$PY" -c 'import mmcv; print(mmcv.__version__)') with ops present"
else
    say "installing mmcv==$(pinned mmcv) with ops (a wheel if one exists, else"
    say "  built from the sdist: 6 to 50 minutes on 2 cores the first time,"
    say "  cached by pip afterwards)"
    MMCV_WITH_OPS=1 "${PIP[@]}" --no-build-isolation "mmcv==$(pinned mmcv)"
fi

if has_dist mmdet && has_dist pycocotools; then
    say "mmdet $("$PY" -c 'import mmdet; print(mmdet.__version__)') and pycocotools present"
else
    say "installing mmdet==$(pinned mmdet) and pycocotools"
    "${PIP[@]}" "mmdet==$(pinned mmdet)" pycocotools
fi

# every line of requirements/tests.txt installed at a version it allows
# (pytest-xdist>=3.6: --no-loadscope-reorder in tools/run_tests.sh)
test_requirements_met() {
    "$PY" - "$ROOT/requirements/tests.txt" <<'EOF2' 2>/dev/null
import sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split('#')[0].strip()
    if line:
        req = Requirement(line)
        if metadata.version(req.name) not in req.specifier:
            sys.exit(1)
EOF2
}

if test_requirements_met; then
    say "test tools present"
else
    say "installing test tools"
    "${PIP[@]}" -r "$ROOT/requirements/tests.txt"
fi

# Checked from / so that the checkout in the current directory does not
# shadow what is installed.
installed_at="$(cd / && "$PY" -c 'import os, mmddp_ext; print(os.path.dirname(os.path.dirname(os.path.abspath(mmddp_ext.__file__))))' 2>/dev/null || true)"
if [ "$installed_at" = "$ROOT" ]; then
    say "mmddp_ext (editable) points at this checkout"
else
    say "installing mmddp_ext from $ROOT (editable)"
    "${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT" >/dev/null
fi

say "ready: $("$PY" -c 'import torch, mmengine, mmcv, mmdet; print("torch", torch.__version__, "| mmengine", mmengine.__version__, "| mmcv", mmcv.__version__, "| mmdet", mmdet.__version__, "| cuda", torch.cuda.is_available())')"
