"""Accuracy benchmark: does the sum of per-layer medians match the whole compiled model?

For each example model (except ic_dr) at batch 32 and 512 on the CPU, once per Keras
backend (TensorFlow and JAX, each in its own process: Keras picks its backend once):
- tbs: per-layer medians (compiled, blocked, harness-corrected) summed, against the whole
  model's compiled forward pass timed the same way;
- seed (TensorFlow run only): the TBS prototype's method, re-implemented: each layer
  called eagerly with time.time() around it, 10 trials, median, summed.

    python benchmarks/accuracy.py                   # both backends; prints a markdown table
    python benchmarks/accuracy.py --out benchmarks/results.md
    python benchmarks/accuracy.py --backend jax     # one backend
    python benchmarks/accuracy.py --training --out benchmarks/training.md

With --training, each layer's forward, backward and update plus the loss are summed
against one whole compiled train step (forward, loss, backward, update), and the
table gives the tool's own overhead: the run's wall time over the time spent inside
timed samples.

Passing means |Σ tbs − whole| <= max(20% of whole, 50 µs). On JAX, models whose
string preprocessing needs TensorFlow (lm_imdb) have no whole-model time to compare.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import build_example, profile_once, tool_overhead

from tbs import backends
from tbs.backends import choose, installed
from tbs.backends.host import host_info

MODELS = ["cnn_flowers", "lm_imdb", "rnn_mnist", "lstm_sunspots", "nn_twins", "rnn_sa"]
BATCHES = [32, 512]
SEED_TRIALS = 10
BACKENDS = ("tensorflow", "jax")
ROWS = Path(__file__).resolve().parent / "rows"  # each backend's last rows, as measured


def seed_method_sum(model, batch: int, device) -> float:
    """The prototype's way: eager layer calls, time.time(), 10 trials; sum of per-layer medians."""
    from tbs.capture.recorder import capture
    from tbs.load.inputs import input_specs, structure_inputs, synthetic_batch

    inputs = device.place(structure_inputs(model, synthetic_batch(input_specs(model), batch, seed=batch)))
    total = 0.0
    for call in capture(model, inputs, training=False).calls:
        trials = []
        for _ in range(SEED_TRIALS):
            start = time.time()
            call.invoke(*call.args, **call.kwargs)
            trials.append(time.time() - start)
        total += statistics.median(trials)
    return total


def _number(value) -> float | None:
    value = float(value)
    return None if value != value else value


def measure(backend: str, models: list[str], batches: list[int], training: bool = False) -> list[dict]:
    """One backend's rows (this process must not have imported Keras yet)."""
    choose(backend)
    from tbs.load.model import load_model
    from tbs.profiles.profile import with_layer_sums

    device = backends.discover(backend).devices[0]
    rows = []
    work_root = Path(tempfile.mkdtemp(prefix=f"tbs-bench-{backend}-"))
    try:
        for name in models:
            model_path = build_example(name, work_root)
            profile = profile_once(model_path, batches, work_root / name, backend, training=training)
            model_rows = with_layer_sums(profile.summary, profile.model).set_index("batch_size")
            for batch in batches:
                r = model_rows.loc[batch]
                whole, layers_sum = _number(r["median_s"]), _number(r["layers_sum_s"])
                error = None if whole is None or layers_sum is None else (layers_sum - whole) / whole
                ok = None if error is None else abs(layers_sum - whole) <= max(0.2 * whole, 50e-6)
                seed = (seed_method_sum(load_model(model_path).model, batch, device)
                        if backend == "tensorflow" and not training else None)
                rows.append(dict(model=name, batch=batch, layers=int(r["layers_measured"]), whole_s=whole,
                                 layers_sum_s=layers_sum, error=error, ok=ok, seed_sum_s=seed,
                                 whole_status=str(r["status"]), overhead=tool_overhead(profile),
                                 elapsed_s=profile.metadata.get("elapsed_s")))
                print(f"[{backend}] {name} @ {batch}: whole {whole} s  Σ tbs {layers_sum} s  error {error}",
                      file=sys.stderr)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    return rows


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.3f} ms"


def table(results: dict[str, list[dict]], versions: dict[str, dict], training: bool = False) -> str:
    host = host_info()
    tf_v, jax_v = versions.get("tensorflow", {}), versions.get("jax", {})
    mode = ("training: Σ (forward + backward + update) + loss against one compiled train step; "
            "`python benchmarks/accuracy.py --training`") if training else "inference; `python benchmarks/accuracy.py`"
    last = "tool overhead TF / JAX (wall ÷ timed)" if training else "seed method Σ / TF whole"
    lines = [
        f"Measured {dt.date.today().isoformat()} on {host['cpu_model']} ({host['cpu_count']} cores), "
        f"TensorFlow {tf_v.get('tensorflow', '-')}, JAX {jax_v.get('jax', '-')}, "
        f"Keras {tf_v.get('keras') or jax_v.get('keras')}; CPU, {mode}.",
        "",
        "| model | batch | layers | TF whole (compiled) | TF Σ per-layer | TF error | JAX whole (xla) "
        f"| JAX Σ per-layer | JAX error | within max(20%, 50 µs) TF / JAX | {last} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    by_key = {b: {(r["model"], r["batch"]): r for r in rows} for b, rows in results.items()}
    keys = list(dict.fromkeys(k for rows in by_key.values() for k in rows))
    for key in keys:
        tf, jx = by_key.get("tensorflow", {}).get(key, {}), by_key.get("jax", {}).get(key, {})

        def cells(r: dict, layers: int) -> list[str]:
            if not r:
                return ["-", "-", "-"]
            whole = _ms(r["whole_s"]) if r["whole_s"] is not None else r["whole_status"]
            layers_sum = _ms(r["layers_sum_s"]) + (f" ({r['layers']} layers)" if r["layers"] < layers else "")
            return [whole, layers_sum, "n/a" if r["error"] is None else f"{r['error']:+.1%}"]

        layers = max(r["layers"] for r in (tf, jx) if r)
        verdict = " / ".join("-" if not r else ("n/a" if r["ok"] is None else ("yes" if r["ok"] else "NO"))
                             for r in (tf, jx))
        seed = f"{tf['seed_sum_s'] / tf['whole_s']:.1f}x" if tf.get("seed_sum_s") and tf.get("whole_s") else "-"
        if training:  # the tool's overhead of the model's whole profile (every batch), once per model
            seed = " / ".join("-" if not r.get("overhead") else f"{r['overhead']:.1f}x" for r in (tf, jx))
        lines.append("| " + " | ".join([key[0], str(key[1]), str(layers), *cells(tf, layers), *cells(jx, layers), verdict, seed]) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", default=",".join(map(str, BATCHES)))
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)  # one backend, for the driver
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    parser.add_argument("--training", action="store_true", help="profile training: phases + loss vs the train step")
    parser.add_argument("--reuse", action="append", default=[], choices=BACKENDS,
                        help="take this backend's rows from its last run (benchmarks/rows/) instead of measuring")
    args = parser.parse_args()
    models, batches = args.models.split(","), [int(b) for b in args.batch.split(",")]
    if args.json:
        rows = measure(args.backend, models, batches, args.training)
        args.json.write_text(json.dumps({"rows": rows, "versions": backends.environment(args.backend, False)["versions"]}))
        return 0
    results, versions = {}, {}
    for backend in (BACKENDS if args.backend == "both" else (args.backend,)):
        if installed(backend):
            print(f"skipping {backend}: {installed(backend)}", file=sys.stderr)
            continue
        saved = ROWS / f"{'training' if args.training else 'inference'}-{backend}.json"
        if backend not in args.reuse:  # each backend in its own process; its rows are kept in benchmarks/rows/
            saved.parent.mkdir(exist_ok=True)
            subprocess.run([sys.executable, __file__, "--backend", backend, "--json", str(saved),
                            "--models", args.models, "--batch", args.batch] + (["--training"] if args.training else []),
                           check=True)
        found = json.loads(saved.read_text())
        results[backend], versions[backend] = found["rows"], found["versions"]
    text = table(results, versions, args.training)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(r["ok"] is not False for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
