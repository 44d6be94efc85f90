"""Tiny real Keras models of every shape for the tests (importing this module starts Keras)."""

from __future__ import annotations

import pickle
from pathlib import Path

import conftest  # noqa: F401  (the backend and log settings come first)
from tbs.backends import keras as _keras

keras = _keras()
layers = keras.layers


def sequential_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="relu", name="dense"), layers.Dropout(0.1, name="dropout"),
         layers.Dense(3, name="dense_1")],
        name="tiny_seq",
    )
    return model


def mlp_model() -> keras.Model:
    """Three Dense(512) and a Dropout that passes its input through in inference."""
    inputs = keras.Input((512,), name="x")
    x = inputs
    for i in range(3):
        x = layers.Dense(512, activation="relu", name=f"dense_{i}")(x)
    x = layers.Dropout(0.2, name="dropout")(x)
    return keras.Model(inputs, layers.Dense(10, name="head")(x), name="mlp")


def fusion_model() -> keras.Model:
    """Layers a compiled model fuses: Conv + BatchNorm + ReLU (one XLA loop fusion of the conv's bias, the
    normalisation and the ReLU) and Dense + Activation (its bias and ReLU: XLA's loop fusion, Grappler's
    _FusedMatMul), then a Dropout that leaves no kernel in inference."""
    return keras.Sequential([keras.Input((12, 12, 3)), layers.Conv2D(8, 3, name="conv"),
                             layers.BatchNormalization(name="bn"), layers.ReLU(name="relu"),
                             layers.GlobalAveragePooling2D(name="pool"), layers.Dense(16, name="dense"),
                             layers.Activation("relu", name="act"), layers.Dropout(0.5, name="drop"),
                             layers.Dense(4, name="out")], name="fusion")


def branchy_model() -> keras.Model:
    """Two inputs, a nested Sequential, a branch and merge, two outputs."""
    augment = keras.Sequential([layers.RandomFlip("horizontal", name="random_flip"), layers.Rescaling(1.0 / 255, name="rescaling")], name="augment")
    image = keras.Input((8, 8, 3), name="image")
    extra = keras.Input((4,), name="extra")
    x = augment(image)
    a = layers.Conv2D(4, 3, padding="same", name="left")(x)
    b = layers.Conv2D(4, 1, name="right")(x)
    x = layers.Concatenate(name="merge")([a, b])
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Concatenate(name="join")([x, extra])
    out1 = layers.Dense(2, name="head_a")(x)
    out2 = layers.Dense(1, name="head_b")(x)
    return keras.Model([image, extra], [out1, out2], name="branchy")


def named_model() -> keras.Model:
    """A Functional model whose input is ``image`` and whose layers take the graph endpoints' old names
    (tests/test_endpoints.py)."""
    image = keras.Input((6,), name="image")
    x = image
    for name in ("input", "input_1", "output_proj"):
        x = layers.Dense(8, activation="relu", name=name)(x)
    return keras.Model(image, layers.Dense(3, activation="softmax", name="output")(x), name="named")


def embedding_model() -> keras.Model:
    tokens = keras.Input((7,), dtype="int32", name="tokens")
    x = layers.Embedding(50, 4)(tokens)
    x = layers.LSTM(5)(x)
    return keras.Model(tokens, layers.Dense(1)(x), name="tiny_lstm")


def text_model() -> keras.Model:
    vectorize = layers.TextVectorization(max_tokens=30, output_sequence_length=6)
    vectorize.adapt(["alpha beta gamma", "delta alpha epsilon", "beta beta zeta"])
    text = keras.Input((1,), dtype="string", name="text")
    x = layers.Embedding(30, 4)(vectorize(text))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(text, layers.Dense(1)(x), name="tiny_text")


def _pickle(model: keras.Model, path: Path) -> Path:
    with open(path, "wb") as f:
        pickle.dump(model, f)
    return path
