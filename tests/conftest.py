"""Shared fixtures: tiny real Keras models of every shape, saved the way users save them."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tbs.backends import keras as _keras  # noqa: E402

keras = _keras()
layers = keras.layers

# Fast statistics for tests: the method is the same, the budgets are tiny. The compiler's analysis
# has tests of its own (test_analysis.py, the JAX profiles); elsewhere it would only add time.
FAST = ["--min-samples", "3", "--max-cell-seconds", "0.05", "--min-block-ms", "1", "--min-span-seconds", "0",
        "--no-analysis"]

CUSTOM_LAYER_SOURCE = '''
import keras


class Doubler(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


class TinySubclassed(keras.Model):
    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)
        self.double = Doubler()
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.double(self.dense(x)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}
'''


def sequential_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="relu", name="dense"), layers.Dropout(0.1, name="dropout"),
         layers.Dense(3, name="dense_1")],
        name="tiny_seq",
    )
    return model


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


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def seq_pkl(model_dir: Path) -> Path:
    return _pickle(sequential_model(), model_dir / "tiny_seq.pkl")


@pytest.fixture(scope="session")
def branchy_keras(model_dir: Path) -> Path:
    path = model_dir / "branchy.keras"
    branchy_model().save(path)
    return path


@pytest.fixture(scope="session")
def custom_source(model_dir: Path) -> Path:
    path = model_dir / "my_layers.py"
    path.write_text(CUSTOM_LAYER_SOURCE)
    return path


@pytest.fixture(scope="session")
def subclassed_pkl(model_dir: Path, custom_source: Path) -> Path:
    from tbs.load.model import import_custom_objects

    classes = import_custom_objects([custom_source])
    model = classes["TinySubclassed"](units=4)
    model(keras.ops.zeros((2, 5)))
    return _pickle(model, model_dir / "subclassed.pkl")
