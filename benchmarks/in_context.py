"""In-context attribution checked against the TensorFlow Profiler, and what tracing costs a profile.

    python benchmarks/in_context.py OUT_DIR          # both backends, each in a process of its own (Keras
                                                     # picks its backend once per process), then the tables
    python benchmarks/in_context.py --tables OUT_DIR # the tables again from the profiles it made

1. Cost: cnn_flowers profiled at batch 8 with the default statistics twice in one process, without and with
   the in-context trace (``MeasureConfig(in_context=False)``); the profile's own record of the trace's seconds
   (metadata ``in_context``) against its elapsed time, and the two elapsed times.
2. Agreement: cnn_flowers and rnn_sa at batch 8 on TensorFlow (in-model = the TensorFlow Profiler's op times
   summed per Keras layer, Grappler's fused kernels shared) and on JAX (in-model = XLA's kernels from
   jax.profiler, fused kernels shared by work), beside each layer's isolated median and the whole model's
   measured time. Where both profilers see the same work (a convolution, a GEMM) they should agree; where a
   layer is many small ops (an LSTM's loop of per-step ops, the TensorFlow graph's variable reads) the
   TensorFlow Profiler's per-op cost inflates its sum and the traced call's span over the measured call.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import markdown  # noqa: E402

SHORT = dict(min_samples=5, cell_budget_seconds=0.5, min_block_seconds=0.005, min_span_seconds=0.3)


def part(backend: str, out: Path) -> None:
    """Runs in a process of its own: the profiles of one backend."""
    import os

    os.environ["KERAS_BACKEND"] = backend
    from common import build_example

    import tbs

    models = {name: build_example(name, out / f"models-{backend}") for name in ("cnn_flowers", "rnn_sa")}
    found: dict[str, dict] = {}
    if backend == "tensorflow":
        for order, traced in enumerate((False, True)):
            started = time.perf_counter()
            p = tbs.profile(models["cnn_flowers"], [8], devices=["cpu:0"], out=out / f"overhead-{order}",
                            measure=tbs.MeasureConfig(in_context=traced), progress=None, report=False)
            found[f"overhead-{order}"] = {"in_context": traced, "wall_s": time.perf_counter() - started,
                                          "elapsed_s": p.metadata.get("elapsed_s"),
                                          "trace_s": sum(v.get("seconds", 0.0) for v in p.meta.in_context.values())}
    for name, path in models.items():
        tbs.profile(path, [8], devices=["cpu:0"], backend=backend, out=out / f"{name}-{backend}",
                    timing=tbs.TimingConfig(**SHORT), progress=None, report=False)
    (out / f"{backend}.json").write_text(json.dumps(found, indent=1))


def tables(out: Path) -> str:
    import pandas as pd

    import tbs
    from tbs.units import format_seconds

    lines = []
    overhead = json.loads((out / "tensorflow.json").read_text())
    lines.append("| run | in-context | elapsed | trace (its own record) | trace / elapsed |\n|---|---|---:|---:|---:|")
    for run, r in overhead.items():
        share = f"{r['trace_s'] / r['elapsed_s']:.1%}" if r["in_context"] else ""
        lines.append(f"| {run} | {r['in_context']} | {r['elapsed_s']:.1f} s | {r['trace_s']:.2f} s | {share} |")
    on = [r["elapsed_s"] for r in overhead.values() if r["in_context"]]
    off = [r["elapsed_s"] for r in overhead.values() if not r["in_context"]]
    lines.append(f"\nmean elapsed with {sum(on) / len(on):.1f} s, without {sum(off) / len(off):.1f} s "
                 f"({sum(on) / sum(off) - 1:+.1%})\n")
    for name in ("cnn_flowers", "rnn_sa"):
        tf, jx = (tbs.load(out / f"{name}-{b}") for b in ("tensorflow", "jax"))
        merged = pd.DataFrame({
            "layer": tf.summary["layer"],
            "isolated (tf)": tf.summary["median_s"].map(format_seconds),
            "TF Profiler ops (tf)": tf.summary["in_model_s"].map(format_seconds),
        }).merge(pd.DataFrame({
            "layer": jx.summary["layer"],
            "isolated (jax)": jx.summary["median_s"].map(format_seconds),
            "XLA kernels (jax)": jx.summary["in_model_s"].map(format_seconds),
            "why (jax)": jx.summary["in_model_note"].fillna(""),
        }), on="layer", how="outer")
        lines.append(f"### {name}, batch 8, per call\n")
        lines.append(markdown(merged).rstrip("\n"))
        for label, p in (("tensorflow", tf), ("jax", jx)):
            m = p.model.iloc[0]
            lines.append(f"\n{label}: whole model measured {format_seconds(m['median_s'])}/call; traced call "
                         f"{format_seconds(m['in_model_s'])} ({m['in_model_s'] / m['median_s']:.2f}x), of it the "
                         f"framework's own {format_seconds(m['unowned_s'])}; Σ isolated "
                         f"{format_seconds(p.summary['median_s'].sum())}; tool {p.meta.in_context}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--part":
        part(sys.argv[2], Path(sys.argv[3]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--tables":  # the tables again from profiles already made
        print(tables(Path(sys.argv[2])))
        return
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for backend in ("tensorflow", "jax"):
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--part", backend, str(out)], check=True, cwd=ROOT)
        print(f"{backend}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(tables(out))


if __name__ == "__main__":
    main()
