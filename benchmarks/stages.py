"""Where one profile's wall time goes, stage by stage: what the tool's overhead (wall ÷ timed) is made of.

Each stage's function is wrapped in a timer for one in-process ``tbs.profile`` (CPU, default
statistics); a stage's time excludes the stages nested in it. Printed as JSON: the wall time from
the start of this script, each stage, the time inside the timed samples and the overhead.

    python benchmarks/stages.py models/ic_dr.pkl 8          # ~45 s on 2 cores
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any, Callable  # noqa: E402

from common import ROOT  # noqa: E402,F401  (puts the repository first on sys.path)

import tbs  # noqa: E402
import tbs.api  # noqa: E402
from tbs import run  # noqa: E402
from tbs.measure import analysis, profiler, timing  # noqa: E402

IMPORTED_S = time.perf_counter() - STARTED
STAGES = [  # (owner, attribute, label)
    (run.Run, "prepare", "start TensorFlow, load the model, make inputs"),
    (profiler.Profiler, "_capture", "capture (one eager pass per batch)"),
    (profiler, "calibrate_devices", "device calibration"),
    (timing.Interleaved, "add", "first calls and iteration probes"),
    (analysis, "analysed", "compiler analysis"),
    (timing.Interleaved, "_rounds", "sampling rounds (the samples, and the device calibration's)"),
    (tbs.api, "finalize", "finalize the store"),
]


def wrap_stages(spent: Counter) -> None:
    """Time every stage into ``spent``, each exclusive of the stages it calls (one thread)."""
    nested: list[float] = []

    def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            nested.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                took, inner = time.perf_counter() - started, nested.pop()
                spent[label] += took - inner
                if nested:
                    nested[-1] += took
        return wrapper

    for owner, name, label in STAGES:
        setattr(owner, name, timed(getattr(owner, name), label))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model file, e.g. models/ic_dr.pkl (python models/build.py ic_dr)")
    parser.add_argument("batches", help="batch sizes, e.g. 8,32")
    args = parser.parse_args()
    spent: Counter = Counter()
    wrap_stages(spent)
    with tempfile.TemporaryDirectory() as directory:
        p = tbs.profile(args.model, [int(b) for b in args.batches.split(",")], devices=["cpu:0"], out=directory,
                        progress=None)
        samples_s = float(p.samples["raw_seconds"].sum())
    wall_s = time.perf_counter() - STARTED
    stages = {"import tbs": IMPORTED_S, **dict(spent)}
    stages["everything else (interpreter, report, writing rows)"] = wall_s - sum(stages.values())
    print(json.dumps({"wall_s": round(wall_s, 2), "inside_samples_s": round(samples_s, 2),
                      "outside_samples_s": round(wall_s - samples_s, 2), "overhead": round(wall_s / samples_s, 2),
                      "stages_s": {k: round(v, 2) for k, v in stages.items()}}, indent=1))


if __name__ == "__main__":
    main()
