"""Build the example models (the seeds' architectures, random weights, no downloads).

    python models/build.py               # the seeds' small models (not the real-size ones below)
    python models/build.py cnn_flowers ic_dr
    python models/build.py --all         # also ic_dr (InceptionV3), resnet50, efficientnet_b0, bert_base

Each model is pickled to models/<name>.pkl. The files are generated, not kept in git.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tbs.backends import installed as _backend_missing  # noqa: E402
from tbs.backends import keras as _quiet_keras  # noqa: E402  (TensorFlow without its log noise)
from tbs.backends.tensorflow.environment import native_stderr_captured  # noqa: E402

if _backend_missing("tensorflow"):  # a JAX-only machine (the GPU machines): the same models, built on JAX
    os.environ.setdefault("KERAS_BACKEND", "jax")
keras = _quiet_keras()
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

HERE = Path(__file__).resolve().parent


def cnn_flowers() -> keras.Model:
    """TBS paper section 6.1: the TensorFlow flowers CNN with augmentation in front (180x180x3, 5 classes)."""
    augment = keras.Sequential(
        [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1), layers.RandomZoom(0.1)], name="augment"
    )
    inputs = keras.Input((180, 180, 3), name="image")
    x = augment(inputs)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Dropout(0.2)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(128, activation="relu")(x)
    outputs = layers.Dense(5)(x)
    return keras.Model(inputs, outputs, name="cnn_flowers")


def _synthetic_reviews(count: int, seed: int = 0) -> np.ndarray:
    """Review-like sentences over a 12,000-word synthetic vocabulary (no dataset download)."""
    rng = np.random.default_rng(seed)
    vocabulary = np.asarray([f"w{i}" for i in range(12_000)], dtype=object)
    # Zipf-like word frequencies, as in real text
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    lengths = rng.integers(40, 200, size=count)
    return np.asarray([" ".join(rng.choice(vocabulary, size=n, p=weights)) for n in lengths], dtype=object)


def lm_imdb() -> keras.Model:
    """TBS paper section 5.1: text classifier with TextVectorization and Embedding."""
    vectorize = layers.TextVectorization(max_tokens=10_000, output_sequence_length=100, name="text_vectorization")
    vectorize.adapt(_synthetic_reviews(2000))
    inputs = keras.Input((1,), dtype="string", name="review")
    x = vectorize(inputs)
    x = layers.Embedding(10_000, 16)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(16, activation="relu")(x)
    outputs = layers.Dense(1)(x)
    return keras.Model(inputs, outputs, name="lm_imdb")


def rnn_mnist() -> keras.Model:
    """TBS paper: SimpleRNN(128) reading MNIST rows (28 steps of 28 pixels)."""
    inputs = keras.Input((28, 28), name="digits")
    x = layers.SimpleRNN(128)(inputs)
    outputs = layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="rnn_mnist")


def lstm_sunspots() -> keras.Model:
    """A small LSTM forecaster over 60-month windows of a univariate series."""
    inputs = keras.Input((60, 1), name="window")
    x = layers.Conv1D(32, 5, padding="causal", activation="relu")(inputs)
    x = layers.LSTM(64, return_sequences=True)(x)
    x = layers.LSTM(32)(x)
    x = layers.Dense(16, activation="relu")(x)
    outputs = layers.Dense(1)(x)
    return keras.Model(inputs, outputs, name="lstm_sunspots")


def nn_twins() -> keras.Model:
    """Cloud-TPU thesis 4.1: I/O access-pattern classifier, 5 features -> 5 -> 3 classes."""
    init = keras.initializers.RandomNormal(seed=0)
    inputs = keras.Input((5,), name="metrics")
    x = layers.Dense(5, activation="relu", kernel_initializer=init)(inputs)
    outputs = layers.Dense(3, activation="softmax", kernel_initializer=init)(x)
    return keras.Model(inputs, outputs, name="nn_twins")


def rnn_sa() -> keras.Model:
    """Cloud-TPU thesis 4.2: sentiment LSTM, Embedding(20000,128) -> LSTM(128) -> 128 -> 64 -> 1."""
    inputs = keras.Input((300,), dtype="int32", name="tokens")
    x = layers.Embedding(20_000, 128)(inputs)
    x = layers.LSTM(128, dropout=0.2)(x)
    x = layers.Dense(128, activation="relu", kernel_initializer="uniform")(x)
    x = layers.Dense(64, activation="relu", kernel_initializer="uniform")(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, outputs, name="rnn_sa")


def ic_dr() -> keras.Model:
    """Cloud-TPU thesis 4.3: InceptionV3 (random weights) at 256x256 + pooling + Dense(1024) + Dense(5)."""
    base = keras.applications.InceptionV3(include_top=False, weights=None, input_shape=(256, 256, 3))
    inputs = keras.Input((256, 256, 3), name="fundus")
    x = base(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(1024, activation="relu")(x)
    outputs = layers.Dense(5, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="ic_dr")


def bert_encoder(blocks: int = 12, width: int = 768, heads: int = 12, sequence: int = 128, ffn: int = 3072,
                 vocabulary: int = 30_522) -> keras.Model:
    """A BERT-base-sized encoder from Keras layers (no keras_hub, no download): token Embedding, then
    ``blocks`` post-norm blocks of MultiHeadAttention and a GELU FFN, each with residual + LayerNormalization.

    No position or segment embeddings and a mean-pooled 2-class head: BERT-base's shapes and FLOPs, not its
    weights. ``bert_base`` is the 12 x 768 one (109M parameters); tests build a small one.
    """
    inputs = keras.Input((sequence,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, width, name="token_embedding")(inputs)
    x = layers.LayerNormalization(epsilon=1e-12, name="embedding_norm")(x)
    for i in range(blocks):
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"block{i}_attention")(x, x)
        x = layers.LayerNormalization(epsilon=1e-12, name=f"block{i}_attention_norm")(
            layers.Add(name=f"block{i}_attention_add")([x, attended]))
        h = layers.Dense(ffn, activation="gelu", name=f"block{i}_ffn_in")(x)
        h = layers.Dense(width, name=f"block{i}_ffn_out")(h)
        x = layers.LayerNormalization(epsilon=1e-12, name=f"block{i}_ffn_norm")(
            layers.Add(name=f"block{i}_ffn_add")([x, h]))
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(2, name="classifier")(x)
    return keras.Model(inputs, outputs, name="bert_base" if (blocks, width) == (12, 768) else "bert_encoder")


def bert_base() -> keras.Model:
    """BERT-base's size: 12 blocks, width 768, 12 heads, FFN 3072, 128 tokens, 30,522-token vocabulary."""
    return bert_encoder()


def resnet50() -> keras.Model:
    """keras.applications ResNet50 (weights=None, 224x224, 1000 classes), 176 leaf layers."""
    return keras.applications.ResNet50(weights=None)


def efficientnet_b0() -> keras.Model:
    """keras.applications EfficientNetB0 (weights=None, 224x224, 1000 classes)."""
    return keras.applications.EfficientNetB0(weights=None)


BUILDERS: dict[str, Callable[[], keras.Model]] = {
    "cnn_flowers": cnn_flowers,
    "lm_imdb": lm_imdb,
    "rnn_mnist": rnn_mnist,
    "lstm_sunspots": lstm_sunspots,
    "nn_twins": nn_twins,
    "rnn_sa": rnn_sa,
    "ic_dr": ic_dr,
    "resnet50": resnet50,
    "efficientnet_b0": efficientnet_b0,
    "bert_base": bert_base,
}
REAL_SIZE = ("ic_dr", "resnet50", "efficientnet_b0", "bert_base")  # 20-440 MB each: built only when named
DEFAULT = [name for name in BUILDERS if name not in REAL_SIZE]


def build(name: str, out_dir: Path = HERE) -> Path:
    """Build one example model with fixed random weights and pickle it."""
    keras.backend.clear_session()  # fresh layer-name counters: dense, dense_1, ...
    keras.utils.set_random_seed(0)
    return save(BUILDERS[name](), Path(out_dir) / f"{name}.pkl")


def save(model: keras.Model, path: Path) -> Path:
    """Pickle ``model`` to ``path`` through a temporary file, so an interrupted build leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pkl.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(model, f)
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*",
                        help=f"models to build (default: all but {', '.join(REAL_SIZE)}): {', '.join(BUILDERS)}")
    parser.add_argument("--all", action="store_true", help="build every model, the real-size ones included")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--if-missing", action="store_true", help="skip models whose file already exists")
    args = parser.parse_args(argv)
    names = list(BUILDERS) if args.all else (args.names or DEFAULT)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"Error: unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILDERS)}", file=sys.stderr)
        return 2
    for name in names:
        target = args.out_dir / f"{name}.pkl"
        if args.if_missing and target.exists():
            print(f"{target} exists", file=sys.stderr)
            continue
        with native_stderr_captured():  # the TF runtime starts here (CUDA probing on GPU-less hosts)
            path = build(name, args.out_dir)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
