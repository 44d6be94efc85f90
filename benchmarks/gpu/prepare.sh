#!/usr/bin/env bash
# Run HERE, before a device call: download into .whl/ the Python 3.12 manylinux wheels of what tbs
# imports on --backend jax that the GPU machine lacks (it has JAX, numpy, pandas, scipy, click,
# cloudpickle, pyyaml, h5py, rich, ml-dtypes, absl-py, narwhals, packaging; no TensorFlow, no Keras),
# and check that they and the working tree fit the device tool's 64 MiB carry limit.
#
#   benchmarks/gpu/prepare.sh            # download the wheels, check the size
#   benchmarks/gpu/prepare.sh --check    # also: a fresh Python 3.12 venv with only the GPU machine's
#                                        # packages + these wheels (--no-deps), then the CPU dry run in it
#
# The versions are the ones tbs is tested with here (the project's virtualenv); keep one version of each.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

WHEELS=(keras==3.15.1 optree==0.20.0 namex==0.1.0 plotly==7.1.0)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
LIMIT_BYTES=$((64 * 1024 * 1024))

mkdir -p .whl
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platform_args[@]}" -d .whl "${WHEELS[@]}"

# one version of each: a stale wheel of another version stops the whole install there
for spec in "${WHEELS[@]}"; do
    name=${spec%%==*}; version=${spec##*==}
    for f in .whl/"${name}"-*.whl; do
        case "$f" in .whl/"${name}-${version}"-*) ;; *) echo "removing stale $f"; rm -f "$f" ;; esac
    done
done

wheel_bytes=$(du -cb .whl/*.whl | tail -1 | cut -f1)
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked_bytes=$( (git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null || true) | tail -1 | cut -f1)
total=$((wheel_bytes + tree_bytes + ${untracked_bytes:-0}))
awk -v w="$wheel_bytes" -v t="$tree_bytes" -v u="${untracked_bytes:-0}" -v s="$total" 'BEGIN {
    m = 1048576; printf "wheels %.1f MiB + tracked %.1f MiB + untracked %.1f MiB = %.1f MiB of the 64 MiB carry limit\n", w/m, t/m, u/m, s/m }'
ls -1 .whl
if [ "$total" -ge "$LIMIT_BYTES" ]; then
    echo "too large for one device call: remove untracked files or old wheels from .whl/" >&2
    exit 1
fi

if [ "${1:-}" = "--check" ]; then
    exec benchmarks/gpu/check_clean_env.sh "${@:2}"
fi
