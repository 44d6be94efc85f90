"""Build, on the machine that measures them, the models the GPU run profiles (random weights, no downloads).

    KERAS_BACKEND=jax python benchmarks/gpu/models.py OUT_DIR NAME... [--small]

The example models come from models/build.py; ResNet50, EfficientNetB0 (keras.applications,
``weights=None``) are built here, and the BERT-base-sized encoder is models/build.py's `bert_encoder`. Everything is plain Keras layers, so
it builds on the JAX backend with no TensorFlow installed (the GPU machines have none). ``--small``
builds the same architectures smaller (64x64 images; 2 encoder blocks of width 128, sequence 32)
for the CPU dry run, where the full sizes would take longer than a rehearsal should.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("cnn_flowers", "rnn_mnist", "rnn_sa", "nn_twins", "lstm_sunspots")
HERE_BUILT = ("resnet50", "efficientnetb0", "bert_base")

# BERT-base: 12 blocks of width 768 (12 heads x 64), feed-forward 3072, sequence 128, WordPiece vocabulary
BERT_BASE = dict(blocks=12, width=768, heads=12, ffn=3072, sequence=128, vocabulary=30_522)
BERT_SMALL = dict(blocks=2, width=128, heads=2, ffn=512, sequence=32, vocabulary=1_000)


@functools.cache
def _example_builder() -> Any:
    """models/build.py as a module (it chooses Keras quietly: KERAS_BACKEND must already say jax)."""
    spec = importlib.util.spec_from_file_location("example_models", ROOT / "models" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resnet50(keras: Any, small: bool) -> Any:
    size = 64 if small else 224
    return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)


def efficientnetb0(keras: Any, small: bool) -> Any:
    size = 64 if small else 224
    return keras.applications.EfficientNetB0(weights=None, input_shape=(size, size, 3), classes=1000)


def bert_base(keras: Any, small: bool) -> Any:
    """models/build.py's BERT-base-sized encoder (the one CPU profiles are taken of), smaller for the dry run."""
    return _example_builder().bert_encoder(**(BERT_SMALL if small else BERT_BASE))


BUILDERS: dict[str, Callable[[Any, bool], Any]] = {
    "resnet50": resnet50, "efficientnetb0": efficientnetb0, "bert_base": bert_base}


def build(name: str, out_dir: Path, small: bool = False) -> Path:
    """Build one model (fixed seed) and pickle it to OUT_DIR/NAME.pkl; returns the path."""
    examples = _example_builder()
    if name not in BUILDERS:  # models/build.py builds resnet50 and bert_base too, but only at full size
        return Path(examples.build(name, out_dir))
    keras = examples.keras
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return examples.save(BUILDERS[name](keras, small), Path(out_dir) / f"{name}.pkl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("names", nargs="+", choices=EXAMPLES + HERE_BUILT)
    parser.add_argument("--small", action="store_true", help="the dry run's smaller sizes")
    args = parser.parse_args(argv)
    for name in args.names:
        path = build(name, args.out_dir, args.small)
        print(f"built {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
