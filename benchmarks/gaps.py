"""Where the per-layer sum misses the whole model: layers alone, chained, and the whole, sampled together.

    python benchmarks/gaps.py lm_imdb                  # TensorFlow, batch 512
    python benchmarks/gaps.py cnn_flowers --batch 512  # JAX
    python benchmarks/gaps.py lstm --batch 512         # JAX training: one LSTM's step, together and apart

Each program is a blocked, compiled runner built by the backend's Device (the same
harness as a profile), and all of them are sampled in one interleaved run so drift hits
them alike. lm_imdb also times an Embedding after a deliberate cache eviction (summing a
16 MB buffer first), to show what a cold cache costs it. Results go to stdout as a table.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from common import build_example

from tbs import backends
from tbs.backends.tensors import iter_tensors, replace_tensors

BACKEND = {"lm_imdb": "tensorflow", "cnn_flowers": "jax"}
CHAINS = {
    "lm_imdb": ["text_vectorization", "embedding", "text_vectorization,embedding"],
    "cnn_flowers": ["rescaling", "conv2d", "max_pooling2d", "conv2d,max_pooling2d", "conv2d_1", "max_pooling2d_1",
                    "conv2d_1,max_pooling2d_1", "dropout,flatten,dense,dense_1",
                    "rescaling,conv2d,max_pooling2d,conv2d_1,max_pooling2d_1,dropout,flatten,dense,dense_1"],
}
Program = tuple[Callable[..., Any], list[Any], list[Any]]  # function, its tensors, the variables it reads


def chain(calls: dict[str, Any], names: list[str]) -> Program:
    """The calls one after another in one program, fed the first one's recorded arguments."""
    first = calls[names[0]]
    structure = (first.args, first.kwargs)

    def run(*flat: Any) -> Any:
        args, kwargs = replace_tensors(structure, list(flat))
        out = first.invoke(*args, **kwargs)
        for name in names[1:]:
            out = calls[name].invoke(out)
        return out

    variables = [v for name in names for v in getattr(calls[name].op, "variables", ())]
    return run, iter_tensors(structure), variables


def cold_embedding(calls: dict[str, Any]) -> dict[str, Program]:
    """TensorFlow: the Embedding after summing a 16 MB buffer (a cache eviction), and that sum alone."""
    import numpy as np
    import tensorflow as tf

    big = tf.constant(np.random.default_rng(0).random(4 * 1024 * 1024, dtype=np.float32))
    embedding = calls["embedding"]
    ids = iter_tensors(embedding.args)

    def evict() -> Any:
        return tf.reduce_sum(big * 1.0001)

    def evict_then_embed(*flat: Any) -> Any:
        done = evict()
        with tf.control_dependencies([done]):
            return done, embedding.invoke(tf.identity(flat[0]))

    return {"cache eviction alone": (evict, [], []),
            "cache eviction, then embedding": (evict_then_embed, ids, list(embedding.op.variables))}


def lstm_step(batch: int) -> None:
    """JAX: an LSTM(64) over 60 steps, its train step compiled as one program against its halves apart.

    Best of 20 calls each, ``jax.jit`` and ``block_until_ready`` (no tbs harness: plain JAX).
    """
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    keras = backends.keras()
    lstm = keras.layers.LSTM(64)
    lstm.build((None, 60, 1))
    weights, state = [v.value for v in lstm.trainable_variables], [v.value for v in lstm.non_trainable_variables]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((batch, 60, 1), dtype=np.float32))
    g = jnp.asarray(rng.random((batch, 64), dtype=np.float32))

    def forward(w: Any, x: Any) -> Any:
        return lstm.stateless_call(w, state, x)[0]

    forward_saving = jax.jit(lambda w, x: jax.vjp(forward, w, x))
    saved = forward_saving(weights, x)[1]
    backward = jax.jit(lambda vjp, g: vjp(g))
    programs = {
        "train step: value_and_grad, one program": (jax.jit(jax.value_and_grad(lambda w, x: jnp.sum(forward(w, x) * g))),
                                                     (weights, x)),
        "forward alone": (jax.jit(forward), (weights, x)),
        "forward saving residuals (jax.vjp)": (forward_saving, (weights, x)),
        "backward from saved residuals": (backward, (saved, g)),
    }
    print(f"LSTM(64), 60 steps, batch {batch}, JAX CPU; best of 20 calls, ms\n")
    for name, (fn, args) in programs.items():
        jax.block_until_ready(fn(*args))
        best = float("inf")
        for _ in range(20):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best = min(best, time.perf_counter() - start)
        print(f"| {name} | {best * 1e3:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(CHAINS) + ["lstm"])
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    backend = BACKEND.get(args.model, "jax")
    os.environ["KERAS_BACKEND"] = backend
    backends.choose(backend)
    if args.model == "lstm":
        lstm_step(args.batch)
        return 0
    import tempfile

    from tbs.capture.recorder import capture
    from tbs.load.inputs import batch_arrays, input_specs, structure_inputs
    from tbs.load.model import load_model
    from tbs.measure.timing import Interleaved, Timer, TimingConfig

    device = backends.discover(backend).devices[0]
    model = load_model(build_example(args.model, Path(tempfile.mkdtemp()))).model
    specs = input_specs(model)
    inputs = device.place(structure_inputs(model, batch_arrays(specs, args.batch, 0, None), specs))
    calls = {c.name: c for c in capture(model, inputs, False).calls}
    programs = {names: chain(calls, names.split(",")) for names in CHAINS[args.model]}
    if args.model == "lm_imdb":
        programs.update(cold_embedding(calls))
    programs["whole model"] = (lambda *flat: model(replace_tensors(inputs, list(flat)), training=False),
                               iter_tensors(inputs), list(model.variables))
    sampler = Interleaved(Timer(TimingConfig(min_samples=20, min_span_seconds=6, cell_budget_seconds=6,
                                             target_ci=0.02)), device.harness(False))
    for name, (fn, tensors, variables) in programs.items():
        sampler.add(name, device.compile_blocked(fn, tensors, False, variables,
                                                 outputs_written=name == "whole model"))  # as tbs times it
    done: dict[str, Any] = {}
    sampler.run(on_done=lambda key, m: done.__setitem__(key, m.summary()))
    print(f"{args.model} on {backend} {device.name}, batch {args.batch}; median ms per call [95% CI]\n")
    for name in programs:
        s = done[name]
        print(f"| {name} | {s.median_s * 1e3:.3f} | [{s.ci_low_s * 1e3:.3f}, {s.ci_high_s * 1e3:.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
