#!/usr/bin/env bash
# The GPU run (issue 29), from the repository root of a checkout on the GPU machine:
#
#   benchmarks/gpu/run.sh                 # installs .whl/*.whl (benchmarks/gpu/prepare.sh made them), then measures
#   benchmarks/gpu/run.sh --dry-run       # the same steps on this machine's CPU: no wheels, small batches
#
# The packed profiles, run.log, steps.log and environment.json go to $OUT (default benchmarks/out/gpu).
# Any other argument goes to benchmarks/gpu/drive.py (--plan, --total-seconds S, --only STEP,...).
# docs/gpu-run.md says how a session with a GPU uses it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/out/gpu}
PYTHON=${PYTHON:-python3}
case " $* " in
*" --dry-run "* | *" --plan "*) ;;
*)
    if ls .whl/*.whl >/dev/null 2>&1; then
        site=${TBS_SITE:-/tmp/tbs-site}
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
            || { echo "installing the carried wheels (.whl/) failed" >&2; exit 2; }
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PYTHON" benchmarks/gpu/drive.py --out "$OUT" "$@"
