"""A shared layer in training: one update and one weight/slot memory per variable, each call's backward kept.

A layer applied twice (a siamese network) computes its weights' gradients in both calls'
backwards, but a real step updates each variable once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from keras_models import keras, layers

import tbs
from tbs.capture.recorder import capture

FAST_TIMING = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)


def _siamese() -> keras.Model:
    a, b = keras.Input((8,), name="a"), keras.Input((8,), name="b")
    shared = layers.Dense(16, name="shared")
    merged = layers.Concatenate(name="cat")([shared(a), shared(b)])
    return keras.Model([a, b], layers.Dense(2, name="head")(merged), name="siamese")


def test_a_shared_layer_is_updated_and_held_once_and_its_later_call_keeps_its_backward(tmp_path: Path) -> None:
    """A layer called twice got an update row and weight/slot memory on both calls; a real step updates once."""
    p = tbs.profile(_siamese(), [4], training=True, timing=FAST_TIMING, progress=None, report=False,
                    measure=tbs.MeasureConfig(analysis=False), out=tmp_path / "p")
    rows = p.summary.set_index("layer")
    assert rows.loc["shared", "phases"] == "forward+backward+update" and rows.loc["shared", "weight_bytes"] == 576
    assert rows.loc["shared#2", "phases"] == "forward+backward"  # its weights' gradients, no second update
    assert rows.loc["shared#2", ["update_s", "weight_bytes", "slot_bytes"]].tolist() == [0, 0, 0]
    assert pd.isna(rows.loc["shared#2"].get("shared_with"))  # not measured as the first call: no update to copy
    entries = {entry["name"]: entry for entry in p.metadata["layers"]}
    assert entries["shared#2"]["weights_of"] == "shared" and "weights_of" not in entries["shared"]


def test_the_split_train_step_updates_a_shared_layers_variables_once() -> None:
    """--verify's replay built one optimizer slot per call of a shared layer, and applied both."""
    from tbs import backends
    from tbs.backends.base import PlacedStep

    model, made = _siamese(), []
    device = backends.discover("tensorflow").devices[0]
    x = [np.random.rand(4, 8).astype("float32") for _ in range(2)]
    inputs = {"/input/a": ("/input", 0), "/input/b": ("/input", 1)}
    steps = [PlacedStep(c.name, c, device, [inputs.get(s, (s, 0)) for s in c.sources],
                        [s not in inputs for s in c.sources]) for c in capture(model, x, True).calls]

    def make() -> keras.optimizers.Optimizer:
        made.append(keras.optimizers.SGD(momentum=0.9))
        return made[-1]

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runner = device.split_train_runner(steps, [("head", 0)], device.place(x), device.place([np.zeros(4, "int32")]),
                                       lambda ys, outs: loss(ys[0], outs[0]), device, make)
    runner(1)
    reference = keras.optimizers.SGD(momentum=0.9)
    reference.build(model.trainable_variables)  # one momentum slot per variable
    assert [len(o.variables) for o in made] == [len(reference.variables)]
