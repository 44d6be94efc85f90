"""Build the big models the report is checked on (random weights, no download), pickled to models/.

    python benchmarks/report_models.py resnet50 efficientnetb0 bert_encoder

ResNet50 and EfficientNetB0 are keras.applications (flat: blocks only by name prefix);
bert_encoder is a BERT-base-sized encoder (12 blocks, width 768, 12 heads, sequence 128)
whose blocks are nested Keras models (transformer_layer_0 ... 11), so its layers' names
carry the nesting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tbs.backends import keras as _quiet_keras  # noqa: E402

keras = _quiet_keras()
from keras import layers  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
WIDTH, HEADS, BLOCKS, SEQUENCE, VOCABULARY = 768, 12, 12, 128, 30522


def resnet50() -> keras.Model:
    return keras.applications.ResNet50(weights=None)


def efficientnetb0() -> keras.Model:
    return keras.applications.EfficientNetB0(weights=None)


def _encoder_block(index: int) -> keras.Model:
    """One post-norm transformer block: self-attention, add & norm, feed-forward (GELU), add & norm."""
    x = keras.Input((SEQUENCE, WIDTH))
    attended = layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="attention")(x, x)
    x1 = layers.LayerNormalization(name="attention_norm")(layers.Add(name="attention_add")([x, attended]))
    hidden = layers.Dense(4 * WIDTH, name="intermediate")(x1)
    hidden = layers.Activation("gelu", name="gelu")(hidden)
    out = layers.Dense(WIDTH, name="output")(hidden)
    out = layers.LayerNormalization(name="output_norm")(layers.Add(name="output_add")([x1, out]))
    return keras.Model(x, out, name=f"transformer_layer_{index}")


def bert_encoder() -> keras.Model:
    """BERT-base-sized: token embeddings, 12 nested transformer blocks, a pooled classifier."""
    tokens = keras.Input((SEQUENCE,), dtype="int32", name="tokens")
    x = layers.Embedding(VOCABULARY, WIDTH, name="token_embedding")(tokens)
    x = layers.LayerNormalization(name="embedding_norm")(x)  # no position embedding: a layer of its own would
    # need a custom class (and --custom-objects); the report looks at the layers' count and nesting
    for index in range(BLOCKS):
        x = _encoder_block(index)(x)
    pooled = layers.Dense(WIDTH, activation="tanh", name="pooler")(layers.GlobalAveragePooling1D(name="pool")(x))
    return keras.Model(tokens, layers.Dense(2, name="classifier")(pooled), name="bert_encoder")


BUILDERS: dict[str, Callable[[], keras.Model]] = {
    "resnet50": resnet50, "efficientnetb0": efficientnetb0, "bert_encoder": bert_encoder}


def build(name: str, out_dir: Path = MODELS_DIR) -> Path:
    """Build one model with fixed random weights and pickle it with cloudpickle (as models/build.py pickles)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    path = out_dir / f"{name}.pkl"
    path.write_bytes(cloudpickle.dumps(BUILDERS[name]()))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", choices=list(BUILDERS))
    parser.add_argument("--out-dir", type=Path, default=MODELS_DIR)
    args = parser.parse_args(argv)
    for name in args.names:
        print(build(name, args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
