"""tbs's whole-model time against a plain compiled loop of ``model(x)``, as a user would time it.

For each example model (except ic_dr) at batch 32 and 512 on the CPU (TensorFlow), one process:
tbs profiles it (default statistics), then, on the same synthetic input, three loops a user might
write are timed in interleaved rounds (each sample at least 50 ms, 21 rounds, median):

- plain loop: ``@tf.function`` running ``model(x)`` in a ``for _ in tf.range(n)`` loop, summing every
  output so nothing is pruned, timed around the call and divided by n. AutoGraph makes it a
  ``tf.while_loop`` with the default ``parallel_iterations=10``: independent calls may overlap.
- the same loop with ``parallel_iterations=1``: one call after another.
- a Python loop of a ``tf.function`` call (dispatch included, what ``%timeit f(x)`` shows).

tbs's whole-model ``median_s`` is one call at a time (parallel_iterations=1); its ``overlapped_s``
is the same model's calls back to back, free to overlap, the plain loop's figure.

    python benchmarks/plain_loop.py --out benchmarks/plain_loop.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import build_example, profile_once

from tbs.backends import choose
from tbs.backends.host import host_info

MODELS = ["cnn_flowers", "lm_imdb", "rnn_mnist", "lstm_sunspots", "nn_twins", "rnn_sa"]
BATCHES = [32, 512]
ROUNDS, SAMPLE_SECONDS = 21, 0.05
ROWS = Path(__file__).resolve().parent / "rows" / "plain-loop-tensorflow.json"


def loops(model, x) -> dict:
    """The three loops a user might time, each as run(n) -> None (waited for)."""
    import tensorflow as tf

    def in_graph(parallel: int):
        @tf.function
        def many(n, x):
            acc = tf.constant(0.0)
            for _ in tf.range(n):
                tf.autograph.experimental.set_loop_options(parallel_iterations=parallel)
                out = model(x, training=False)
                acc += tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tf.nest.flatten(out)])
            return acc

        return lambda n: many(tf.constant(n), x).numpy()

    call = tf.function(lambda x: model(x, training=False))

    def python_loop(n: int) -> None:
        for _ in range(n):
            out = call(x)
        tf.nest.flatten(out)[0].numpy()

    return {"plain_s": in_graph(10), "plain_sequential_s": in_graph(1), "python_loop_s": python_loop}


def seconds_per_call(runs: dict, harness) -> dict[str, float]:
    """Each run's median seconds per call, sampled in interleaved rounds (drift hits them alike).

    Runs named ``tbs_*`` are tbs's own runners: the harness (an empty loop, timed in the same
    rounds) is subtracted from them as tbs does; the user's loops are taken as they come.
    """
    import numpy as np

    sizes = {}
    for name, run in runs.items():
        run(1), run(1)
        n, elapsed = 1, 0.0
        while elapsed < SAMPLE_SECONDS / 4:
            n *= 2
            start = time.perf_counter()
            run(n)
            elapsed = time.perf_counter() - start
        sizes[name] = max(1, int(n * SAMPLE_SECONDS / elapsed))
    samples: dict[str, list[float]] = {name: [] for name in [*runs, "harness_1", "harness_500"]}
    for _ in range(ROUNDS):
        for name, run, n in [*((k, r, sizes[k]) for k, r in runs.items()), ("harness_1", harness, 1),
                             ("harness_500", harness, 500)]:
            start = time.perf_counter()
            run(n)
            samples[name].append(time.perf_counter() - start)
    per_iteration = max((np.median(samples["harness_500"]) - np.median(samples["harness_1"])) / 499, 0.0)
    per_call = max(float(np.median(samples["harness_1"])) - per_iteration, 0.0)
    found = {}
    for name in runs:
        raw = np.asarray(samples[name])
        found[name] = float(np.median(
            (raw - per_call) / sizes[name] - per_iteration if name.startswith("tbs_") else raw / sizes[name]))
    return found


def measure(models: list[str], batches: list[int]) -> list[dict]:
    choose("tensorflow")
    import tensorflow as tf

    from tbs.backends import discover
    from tbs.backends.tensors import iter_tensors, replace_tensors
    from tbs.load.inputs import batch_arrays, input_specs, structure_inputs
    from tbs.load.model import load_model

    device = discover("tensorflow").devices[0]
    rows = []
    root = Path(tempfile.mkdtemp(prefix="tbs-plain-"))
    try:
        for name in models:
            path = build_example(name, root)
            profile = profile_once(path, batches, root / name)
            model = load_model(path).model
            specs = input_specs(model)
            for batch in batches:
                x = device.place(structure_inputs(model, batch_arrays(specs, batch, 0, None), specs))
                flat = iter_tensors(x)

                def forward(*tensors):
                    return model(replace_tensors(x, list(tensors)), training=False)

                runs = {**loops(model, x), "tbs_runner_s": device.compile_blocked(forward, flat, False, outputs_written=True),
                        "tbs_overlapped_runner_s": device.overlapped_blocked(forward, flat, False)}
                timed = seconds_per_call(runs, device.harness(False))
                r = profile.model.set_index("batch_size").loc[batch]
                rows.append(dict(model=name, batch=batch, tbs_s=float(r["median_s"]),
                                 tbs_overlapped_s=float(r["overlapped_s"]), **timed))
                print(f"{name} @ {batch}: {rows[-1]}", file=sys.stderr)
                del x, flat, runs
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1e3:.3f} ms"


def _ratio(a: float, b: float) -> str:
    return "–" if math.isnan(a / b) else f"{a / b:.2f}"


def _near(a: float, b: float) -> bool:
    return abs(a / b - 1) <= 0.1


def why(r: dict) -> str:
    """One line: where tbs's figure and the plain loop's part, and why (from the same run's measurements)."""
    one, plain, overlapped, sequential = r["tbs_s"], r["plain_s"], r["tbs_overlapped_s"], r["plain_sequential_s"]
    if _near(one, plain):
        return "agree within 10%"
    parts = []
    if math.isnan(overlapped):
        parts.append("one call fills a sample, so tbs does not time calls back to back")
    elif _near(overlapped, plain):
        parts.append(f"the plain loop overlaps independent calls ({one / overlapped:.2g}x one call's throughput); "
                     f"tbs's calls-back-to-back figure matches it")
    else:
        parts.append(f"tbs's calls back to back are {overlapped / plain:.2f}x the plain loop")
    if _near(one, sequential):
        parts.append("its one-call figure matches the loop run one call at a time")
    elif _near(r["tbs_runner_s"], sequential):
        parts.append(f"its one-call figure ({one / sequential:.2f}x the loop one call at a time) was taken in another "
                     f"stretch of this machine: re-timed beside the loop, tbs's own runner is "
                     f"{r['tbs_runner_s'] / sequential:.2f}x")
    else:
        parts.append(f"one call at a time, tbs's runner is {r['tbs_runner_s'] / sequential:.2f}x the loop")
    return "; ".join(parts)


def table(rows: list[dict]) -> str:
    host = host_info()
    lines = [
        f"Measured {dt.date.today().isoformat()} on {host['cpu_model']} ({host['cpu_count']} cores), TensorFlow, CPU, "
        "inference; `python benchmarks/plain_loop.py`. Profile figures as tbs reports them; the loops timed right "
        "after, in the same process, on the same input.",
        "",
        "| model | batch | tbs: one call | plain loop (`tf.range`) | ratio | tbs: calls back to back | ratio "
        "| plain loop, one call at a time | ratio | Python loop of `tf.function` | why they differ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([
            r["model"], str(r["batch"]), _ms(r["tbs_s"]), _ms(r["plain_s"]), _ratio(r["tbs_s"], r["plain_s"]),
            _ms(r["tbs_overlapped_s"]), _ratio(r["tbs_overlapped_s"], r["plain_s"]), _ms(r["plain_sequential_s"]),
            _ratio(r["tbs_s"], r["plain_sequential_s"]), _ms(r["python_loop_s"]), why(r)]) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", default=",".join(map(str, BATCHES)))
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    parser.add_argument("--reuse", action="store_true", help="re-render the last rows instead of measuring")
    args = parser.parse_args()
    if not args.reuse:
        rows = measure(args.models.split(","), [int(b) for b in args.batch.split(",")])
        ROWS.parent.mkdir(exist_ok=True)
        ROWS.write_text(json.dumps(rows, indent=1))
    text = table(json.loads(ROWS.read_text()))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
