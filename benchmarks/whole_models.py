"""Keras rebuilds (random weights) of the models in tbs/predictions/reference/whole_models.csv, and their fused
whole-model programs' kernels as tbs records them (compiled for this CPU, analysed with tbs.backends.hlo_kernels):
the inference forward (``kernels``); whole_train_steps.py has one train step's, for whole_training.csv.

Every line is written here from the published architectures' facts (layer sizes, kernel sizes, strides); no
source code is copied. ResNet-50 is keras.applications' (v1: the stride on the first 1x1 convolution of a
downsampling block, where NVIDIA's v1.5 puts it on the 3x3; the FLOPs differ by about 5%).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CACHE = Path(os.environ.get("TBS_WHOLE_CACHE", "/tmp/tbs_whole_kernels"))
BERT = {"bert_base": (12, 768), "bert_large": (24, 1024)}
VOCABULARY = 30522
# BERT's dropout (bert_config.json: hidden_dropout_prob and attention_probs_dropout_prob), which SQuAD fine-tuning
# trains with: in a train step it is memory passes (and random bits) a GPU pays; inference is built without it.
DROPOUT = 0.1


def bert(layers: int, hidden: int, sequence: int, dropout: float = 0.0):
    """BERT's encoder and a SQuAD head: token and position embeddings, ``layers`` post-norm transformer blocks
    (with ``dropout``, as fine-tuning trains it: Keras's attention then writes its probabilities out to drop them,
    where without it the attention runs as one fused computation, as an inference graph does)."""
    import keras

    ids = keras.Input((sequence,), dtype="int32", name="input_ids")
    x = keras.layers.Embedding(VOCABULARY, hidden, name="word_embeddings")(ids)
    x = PositionEmbedding(name="position_embeddings")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_norm")(x)
    x = keras.layers.Dropout(dropout, name="embeddings_dropout")(x)
    for index in range(layers):
        attended = keras.layers.MultiHeadAttention(hidden // 64, 64, dropout=dropout, name=f"attention_{index}")(x, x)
        attended = keras.layers.Dropout(dropout, name=f"attention_dropout_{index}")(attended)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"attention_norm_{index}")(
            keras.layers.Add(name=f"attention_add_{index}")([x, attended]))
        inner = keras.layers.Dense(4 * hidden, activation="gelu", name=f"intermediate_{index}")(x)
        out = keras.layers.Dropout(dropout, name=f"output_dropout_{index}")(
            keras.layers.Dense(hidden, name=f"output_{index}")(inner))
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"output_norm_{index}")(
            keras.layers.Add(name=f"output_add_{index}")([x, out]))
    logits = keras.layers.Dense(2, name="squad_logits")(x)
    return keras.Model(ids, logits, name="bert")


def _position_embedding_class():
    import keras

    class _PositionEmbedding(keras.layers.Layer):
        """A learned embedding per position, added to the tokens'."""

        def build(self, shape):
            self.table = self.add_weight(shape=(shape[1], shape[2]), name="table")

        def call(self, x):
            return x + self.table

    return _PositionEmbedding


def PositionEmbedding(name: str):  # noqa: N802 (a layer's constructor)
    return _position_embedding_class()(name=name)


def unet_medical():
    """U-Net (Ronneberger et al.) as NVIDIA's TF2 U-Net Medical: 572x572x1 in, unpadded 3x3 convolutions with
    ReLU, 2x2 max-pooling, 3x3 stride-2 transposed convolutions, centre crop and concatenation, 2 classes out."""
    import keras

    inputs = keras.Input((572, 572, 1), name="image")
    x, skips = inputs, []
    for level, filters in enumerate((64, 128, 256, 512)):
        x = keras.layers.Conv2D(filters, 3, activation="relu", name=f"down{level}_conv1")(x)
        x = keras.layers.Conv2D(filters, 3, activation="relu", name=f"down{level}_conv2")(x)
        skips.append(x)
        x = keras.layers.MaxPooling2D(2, name=f"down{level}_pool")(x)
    x = keras.layers.Conv2D(1024, 3, activation="relu", name="bottleneck_conv1")(x)
    x = keras.layers.Conv2D(1024, 3, activation="relu", name="bottleneck_conv2")(x)
    x = keras.layers.Conv2DTranspose(512, 3, strides=2, padding="same", activation="relu", name="bottleneck_up")(x)
    for level, filters in zip((3, 2, 1, 0), (512, 256, 128, 64)):
        skip = skips[level]
        crop = (skip.shape[1] - x.shape[1]) // 2
        x = keras.layers.Concatenate(name=f"up{level}_concat")(
            [x, keras.layers.Cropping2D(crop, name=f"up{level}_crop")(skip)])
        x = keras.layers.Conv2D(filters, 3, activation="relu", name=f"up{level}_conv1")(x)
        x = keras.layers.Conv2D(filters, 3, activation="relu", name=f"up{level}_conv2")(x)
        if level:
            x = keras.layers.Conv2DTranspose(filters // 2, 3, strides=2, padding="same", activation="relu",
                                             name=f"up{level}_up")(x)
    outputs = keras.layers.Conv2D(2, 1, name="logits")(x)
    return keras.Model(inputs, outputs, name="unet_medical")


def resnet50():
    import keras

    return keras.applications.ResNet50(weights=None)


def build(model: str, sequence: int | None, training: bool = False):
    """The Keras model of a whole_models.csv ``model`` (a BERT at ``sequence`` tokens, with its fine-tuning
    dropout where it is built to be ``training``)."""
    if model in BERT:
        return bert(*BERT[model], sequence, DROPOUT if training else 0.0)
    return {"unet_medical": unet_medical, "resnet50": resnet50}[model]()


SCALED = ("m", "count", "bytes", "flops")


def extrapolated(one: list[dict], two: list[dict], batch: int) -> list[dict] | None:
    """The kernels at ``batch`` from the programs at batch 1 and 2, each figure affine in the batch (the weights'
    bytes stay, the activations' grow); None where the two programs' kernels differ."""
    if [k["kind"] for k in one] != [k["kind"] for k in two]:
        return None
    out = []
    for a, b in zip(one, two):
        grown = dict(b)
        for name in SCALED:
            if name in a:
                grown[name] = a[name] + (b[name] - a[name]) * (batch - 1)
        out.append(grown)
    return out


def kernels(model: str, sequence: int | None, batch: int, half: bool) -> list[dict]:
    """The whole model's fused program's kernels at ``batch`` (float16 compute with ``half``).

    Compiled at batch 1 and 2 (a CPU compile of BERT-large takes minutes); every other batch is extrapolated
    from those two, kernel by kernel, where both programs have the same kernels (each figure affine in the
    batch: the weights' bytes stay, the activations' grow), else compiled.
    """
    if batch <= 2:
        return compiled_kernels(model, sequence, batch, half)
    one, two = (compiled_kernels(model, sequence, b, half) for b in (1, 2))
    found = extrapolated(one, two, batch)
    return found if found is not None else compiled_kernels(model, sequence, batch, half)


def cached(model: str, sequence: int | None, half: bool) -> bool:
    """Whether the batch-1 and batch-2 programs are compiled already (a half-precision BERT-large takes 5 minutes)."""
    return all((CACHE / f"{model}-{sequence or 0}-{b}-{'fp16' if half else 'fp32'}.json").exists() for b in (1, 2))


def _program_path(path: Path) -> Path:
    return path.with_suffix(".hlo.json.gz")


_READ: dict[Path, list[dict]] = {}  # each program's kernels, read once per run (a BERT-large's HLO is 10 MB)


def cached_kernels(path: Path) -> list[dict] | None:
    """A cached program's kernels: read again from its optimised HLO where that is cached (so a change to
    tbs.backends.hlo_kernels re-prices every program without a recompile), else the kernels cached with it."""
    from tbs.backends import hlo_kernels

    program = _program_path(path)
    if path not in _READ and program.exists():
        saved = json.loads(gzip.decompress(program.read_bytes()))
        names = saved["names"]
        _READ[path] = [dict(k, op=names.get(k["op"], k["op"])) if k.get("op") else k
                       for k in hlo_kernels.program_kernels(saved["hlo"])]
    elif path not in _READ and path.exists():
        _READ[path] = json.loads(path.read_text())
    return [dict(k) for k in _READ[path]] if path in _READ else None


@contextlib.contextmanager
def recording(path: Path):
    """Keeps the optimised HLO text that tbs's analysis reads kernels from (and each op name's Keras call path,
    as the analysis renames it) beside the kernels cached at ``path``."""
    from tbs.backends import xla

    original, seen = xla.kernels_of, {}

    def keep(text: str, rename=None):
        ops = set(re.findall(r'op_name="([^"]*)"', text))  # every name a kernel can carry (hlo_kernels._op_name)
        seen.update(hlo=text, names={op: rename(op) for op in ops if op} if rename else {})
        return original(text, rename)

    xla.kernels_of = keep
    try:
        yield
    finally:
        xla.kernels_of = original
    if seen:
        path.parent.mkdir(parents=True, exist_ok=True)
        _program_path(path).write_bytes(gzip.compress(json.dumps(seen).encode()))


def compiled_kernels(model: str, sequence: int | None, batch: int, half: bool) -> list[dict]:
    """The kernels of the compiled program at ``batch``, cached on disk."""
    path = CACHE / f"{model}-{sequence or 0}-{batch}-{'fp16' if half else 'fp32'}.json"
    found = cached_kernels(path)
    if found is not None:
        return found
    import keras
    import numpy as np
    import tensorflow as tf

    from tbs.backends.tensorflow.analysis import program_cost

    keras.mixed_precision.set_global_policy("mixed_float16" if half else "float32")
    try:
        network = build(model, sequence)
        shape = (batch, *network.inputs[0].shape[1:])
        dtype = network.inputs[0].dtype
        data = tf.constant(np.zeros(shape, "int32") if "int" in str(dtype) else np.random.rand(*shape).astype("float32"))
        with recording(path):
            cost = program_cost("/CPU:0", "cpu", lambda t: network(t, training=False), [data])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return kept_kernels(path, cost, f"{model} at batch {batch}")


def kept_kernels(path: Path, cost, what: str) -> list[dict]:
    """A compile's kernels (``cost``: tbs's program analysis), cached at ``path``; an error naming ``what`` where
    the analysis found none."""
    if not cost.kernels:
        raise RuntimeError(f"no kernels for {what}: {cost.reason}")
    found = json.loads(cost.kernels)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found))
    return found


def main() -> None:
    """Fill the cache for every configuration of whole_models.csv (slow: one CPU compile each)."""
    import pandas as pd

    table = pd.read_csv(Path(__file__).resolve().parent.parent / "tbs/predictions/reference/whole_models.csv")
    only = set(sys.argv[1:])
    configs = table[["model", "sequence_length", "batch_size", "precision"]].drop_duplicates()
    configs = configs[configs["batch_size"] <= 2].sort_values("precision", key=lambda p: p == "fp16", kind="stable")
    for row in configs.itertuples():
        if only and row.model not in only:
            continue
        sequence = int(row.sequence_length) if row.sequence_length == row.sequence_length else None
        start = time.time()
        found = kernels(row.model, sequence, int(row.batch_size), row.precision == "fp16")
        print(f"{row.model} seq {sequence} batch {row.batch_size} {row.precision}: {len(found)} kernels "
              f"({time.time() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
