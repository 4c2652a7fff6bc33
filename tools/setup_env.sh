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
#   pytest-xdist, onnx,
#   onnxruntime
#   mmddp_ext itself            editable install of this checkout
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
PIP=("$PY" -m pip install --disable-pip-version-check)

say() { echo "[setup_env] $*"; }

pinned() {  # pinned NAME -> version from requirements/pinned.txt
    sed -n "s/^$1==\(.*\)$/\1/p" "$ROOT/requirements/pinned.txt"
}

# One Python process reports what is there (each check used to start its
# own interpreter and import torch: 20 s of checks on 2 cores): KEY=VALUE
# lines, VALUE 'missing' when absent. Run from / so that the checkout in
# the current directory does not shadow what is installed.
probe() {
    (cd / && "$PY" - "$ROOT/requirements/tests.txt" <<'PROBE'
import os
import sys
from importlib import metadata


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return 'missing'


def report(key, value):
    print(f'{key}={value}')


try:
    import torch
    report('torch', torch.__version__)
    report('cuda', torch.cuda.is_available())
except Exception:  # not installed, or an install that does not import
    report('torch', 'missing')
try:
    from packaging.version import Version
    build_ok = (Version(version('setuptools')) < Version('70')
                and version('wheel') != 'missing'
                and version('ninja') != 'missing')
except Exception:  # no packaging, or no setuptools ('missing')
    build_ok = False
report('build_tools', 'ok' if build_ok else 'missing')
report('mmengine', version('mmengine'))
try:
    import mmcv
    import mmcv.ops  # noqa: F401
    report('mmcv', mmcv.__version__)
except Exception:  # no mmcv, no ops, or ops built for another torch
    report('mmcv', 'missing')
both = 'missing' not in (version('mmdet'), version('pycocotools'))
report('mmdet', version('mmdet') if both else 'missing')
# every line of requirements/tests.txt installed at a version it allows
# (pytest-xdist>=3.6: --no-loadscope-reorder in tools/run_tests.sh)
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
tests_ok = True
for line in open(sys.argv[1]):
    line = line.split('#')[0].strip()
    if line:
        req = Requirement(line)
        if version(req.name) not in req.specifier:
            tests_ok = False
report('test_tools', 'ok' if tests_ok else 'missing')
try:
    import mmddp_ext
    report('mmddp_ext_at',
           os.path.dirname(os.path.dirname(os.path.abspath(
               mmddp_ext.__file__))))
except Exception:  # not installed, or installed from a deleted checkout
    report('mmddp_ext_at', 'missing')
PROBE
    )
}

# value KEY -> its VALUE in the last probe
value() { sed -n "s/^$1=//p" <<< "$STATE"; }

say "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
STATE="$(probe)"
INSTALLED=0

if [ "$(value torch)" != missing ]; then
    say "torch $(value torch) present, kept"
else
    say "installing torch==$(pinned torch) (CPU build; bring your own CUDA torch on GPU machines)"
    "${PIP[@]}" "torch==$(pinned torch)"
    INSTALLED=1
fi

if [ "$(value build_tools)" = ok ]; then
    say "build tools present"
else
    say "installing mmcv build tools: $(grep -v '^#' "$ROOT/requirements/build.txt" | tr '\n' ' ')"
    "${PIP[@]}" -r "$ROOT/requirements/build.txt"
    INSTALLED=1
fi

if [ "$(value mmengine)" != missing ]; then
    say "mmengine $(value mmengine) present"
else
    say "installing mmengine==$(pinned mmengine)"
    "${PIP[@]}" "mmengine==$(pinned mmengine)"
    INSTALLED=1
fi

if [ "$(value mmcv)" != missing ]; then
    say "mmcv $(value mmcv) with ops present"
else
    say "installing mmcv==$(pinned mmcv) with ops (a wheel if one exists, else"
    say "  built from the sdist: 6 to 50 minutes on 2 cores the first time,"
    say "  cached by pip afterwards)"
    MMCV_WITH_OPS=1 "${PIP[@]}" --no-build-isolation "mmcv==$(pinned mmcv)"
    INSTALLED=1
fi

if [ "$(value mmdet)" != missing ]; then
    say "mmdet $(value mmdet) and pycocotools present"
else
    say "installing mmdet==$(pinned mmdet) and pycocotools"
    "${PIP[@]}" "mmdet==$(pinned mmdet)" pycocotools
    INSTALLED=1
fi

if [ "$(value test_tools)" = ok ]; then
    say "test tools present"
else
    say "installing test tools"
    "${PIP[@]}" -r "$ROOT/requirements/tests.txt"
    INSTALLED=1
fi

if [ "$(value mmddp_ext_at)" = "$ROOT" ]; then
    say "mmddp_ext (editable) points at this checkout"
else
    say "installing mmddp_ext from $ROOT (editable)"
    "${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT" >/dev/null
    INSTALLED=1
fi

if [ "$INSTALLED" = 1 ]; then
    STATE="$(probe)"
fi
for key in torch mmengine mmcv mmdet mmddp_ext_at; do
    if [ "$(value "$key")" = missing ]; then
        say "ERROR: $key is still missing after the set-up (see pip's output above)"
        exit 1
    fi
done

# The Slurm tests' one-node cluster (tools/slurm_cluster.sh) needs Debian's
# slurm-wlm and munge, and root to start their daemons.
slurm_missing() {
    local binary
    for binary in slurmctld munged; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$binary" >/dev/null \
            || return 0
    done
    return 1
}
if [ "$(id -u)" != 0 ]; then
    say "not root: the Slurm tests skip unless a test cluster already runs"
elif ! slurm_missing; then
    say "slurm-wlm and munge present"
elif command -v apt-get >/dev/null; then
    say "installing slurm-wlm and munge (apt-get)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq slurm-wlm munge >/dev/null; }; then
        say "WARNING: apt-get could not install slurm-wlm munge: the Slurm" \
            "tests will skip"
    fi
else
    say "slurm-wlm/munge missing and no apt-get: the Slurm tests will skip"
fi
say "ready: torch $(value torch) | mmengine $(value mmengine) | mmcv $(value mmcv) | mmdet $(value mmdet) | cuda $(value cuda)"
