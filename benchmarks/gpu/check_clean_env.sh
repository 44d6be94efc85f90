#!/usr/bin/env bash
# The real check that the GPU run needs no TensorFlow (benchmarks/gpu/prepare.sh --check runs it):
# a fresh Python 3.12 venv with only packages the GPU machine has (docs/gpu-run.md lists them;
# JAX 0.11.2 here is its CPU build), the carried wheels installed as the GPU machine installs them
# (--no-deps --target), then the whole CPU dry run from it.
#
#   VENV=/tmp/tbs-gpu-venv PY312=python3.12 benchmarks/gpu/check_clean_env.sh [drive.py options]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
VENV=${VENV:-/tmp/tbs-gpu-venv}
PY312=${PY312:-python3.12}
SITE=${SITE:-/tmp/tbs-gpu-site}
GPU_MACHINE_PACKAGES=(jax==0.11.2 jaxlib==0.11.2 numpy==2.5.2 pandas scipy click cloudpickle pyyaml h5py rich
                      ml-dtypes absl-py narwhals packaging typing-extensions psutil)
if [ ! -x "$VENV/bin/python" ]; then
    "$PY312" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "${GPU_MACHINE_PACKAGES[@]}"
fi
if "$VENV/bin/python" -c "import tensorflow" 2>/dev/null; then
    echo "$VENV has TensorFlow: it must not (make a fresh one: rm -rf $VENV)" >&2
    exit 1
fi
rm -rf "$SITE"
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
PYTHON="$VENV/bin/python" PYTHONPATH="$SITE" OUT=${OUT:-benchmarks/out/gpu-dry-run} exec benchmarks/gpu/run.sh --dry-run "$@"
