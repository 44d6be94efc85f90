"""One published train step of a whole_models.py rebuild (whole_training.csv): its optimizer, loss and data, and
its program's kernels as tbs records them (``train_kernels``: tbs's own TensorFlow train-step program, the one a
training profile's model cell analyses, compiled for this CPU at batch 1 and 2 and extrapolated to the published
batch kernel by kernel).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

from whole_models import (BERT, DROPOUT, SCALED, VOCABULARY, build, cached_kernels, extrapolated, kept_kernels,
                          recording)

TRAIN_CACHE = Path(os.environ.get("TBS_WHOLE_TRAIN_CACHE", "/tmp/tbs_whole_train_kernels"))


# The optimizer each published training run used, as Keras has it: BERT's SQuAD fine-tuning Adam with weight decay
# (AdamWeightDecay), U-Net Medical's Adam, ResNet-50 v1.5's SGD with momentum 0.875.
OPTIMIZERS = {"bert": ("AdamW", {"weight_decay": 0.01}), "unet_medical": ("Adam", {}),
              "resnet50": ("SGD", {"momentum": 0.875})}


def optimizer_of(model: str, loss_scale: bool):
    """A fresh optimizer for ``model``'s train step (wrapped in dynamic loss scaling with ``loss_scale``, as Keras's
    compile() wraps a mixed_float16 model's and as the published AMP runs did)."""
    import keras

    name, options = OPTIMIZERS["bert" if model in BERT else model]
    optimizer = getattr(keras.optimizers, name)(learning_rate=1e-4, **options)
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scale else optimizer


def train_loss(model: str, network):
    """The published run's loss: SQuAD's span loss (start and end positions), U-Net's cross-entropy plus Dice loss
    over one-hot masks, ResNet-50's label-smoothed (0.1) cross-entropy."""
    import keras

    ops, out = keras.ops, network.outputs[0].shape
    if model in BERT:
        def span(targets, logits):
            logits = ops.cast(logits, "float32")
            ce = keras.losses.sparse_categorical_crossentropy
            return (ops.mean(ce(targets[0], logits[..., 0], from_logits=True))
                    + ops.mean(ce(targets[1], logits[..., 1], from_logits=True))) / 2
        return span
    if model == "resnet50":
        smoothed = keras.losses.CategoricalCrossentropy(label_smoothing=0.1)
        return lambda targets, probabilities: smoothed(targets[0], ops.cast(probabilities, "float32"))

    def ce_dice(targets, logits):
        logits = ops.cast(logits, "float32")
        ce = ops.mean(keras.losses.categorical_crossentropy(targets[0], logits, from_logits=True))
        predict, axes = ops.softmax(logits), tuple(range(1, len(out) - 1))
        dice = (2 * ops.sum(predict * targets[0], axes) + 1e-6) / (ops.sum(predict + targets[0], axes) + 1e-6)
        return ce + ops.mean(1 - dice)
    return ce_dice


def train_shapes(model: str, network, batch: int) -> tuple[list[tuple[tuple, str]], list[tuple[tuple, str]]]:
    """(shape, dtype) of a train step's inputs and targets: token ids and two answer positions for a BERT, images
    and one-hot labels (or masks) otherwise."""
    shape = (batch, *network.inputs[0].shape[1:])
    if model in BERT:
        return [(shape, "int32")], [((batch,), "int32")] * 2
    return [(shape, "float32")], [((batch, *network.outputs[0].shape[1:]), "float32")]


def train_data(model: str, network, batch: int) -> tuple[list, list, object]:
    """(inputs, targets, loss) of one published train step, as TensorFlow tensors of random values."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    [(inputs, _)], targets = train_shapes(model, network, batch)
    if model in BERT:
        ids = tf.constant(rng.integers(0, VOCABULARY, inputs).astype("int32"))
        return [ids], [tf.constant(rng.integers(0, inputs[1], batch).astype("int32")) for _ in range(2)], \
            train_loss(model, network)
    images, classes = tf.constant(rng.random(inputs, "float32")), targets[0][0][-1]
    return [images], [tf.one_hot(rng.integers(0, classes, targets[0][0][:-1]), classes)], train_loss(model, network)


def train_path(model: str, sequence: int | None, batch: int, half: bool, loss_scale: bool) -> Path:
    """Where a train step's kernels are cached: a BERT's name carries its dropout, so that a step compiled
    without it (before 2026-11-27) is never read as one with it."""
    scaled = "-lossscale" if loss_scale else ""
    dropped = f"-dropout{DROPOUT:g}" if model in BERT else ""
    return TRAIN_CACHE / f"{model}-{sequence or 0}-{batch}-{'fp16' if half else 'fp32'}{scaled}{dropped}.json"


def train_kernels(model: str, sequence: int | None, batch: int, half: bool, loss_scale: bool = False) -> list[dict]:
    """One train step's program's kernels at ``batch``: compiled at batch 1 and 2, extrapolated kernel by kernel
    like ``kernels`` (the optimizer's update kernels do not grow with the batch: both programs have them alike)."""
    if batch <= 2 or train_path(model, sequence, batch, half, loss_scale).exists():
        return compiled_train_kernels(model, sequence, batch, half, loss_scale)
    one, two = (compiled_train_kernels(model, sequence, b, half, loss_scale) for b in (1, 2))
    return aligned(one, two, batch)


def _kernel_key(kernel: dict) -> tuple[str, str]:
    """A kernel's kind and op, the instance suffix of its scope dropped."""
    head, _, rest = str(kernel.get("op", "")).partition("/")
    return kernel["kind"], re.sub(r"_\d+$", "", head) + "/" + rest


def _unchanged(one: list[dict], two: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """The kernels both programs have alike (kind, op, bytes and FLOPs: the optimizer's update of each variable, a
    weight's cast), which the batch does not touch, and the rest of each program in order."""
    def signature(kernel: dict) -> tuple:
        return _kernel_key(kernel), kernel.get("bytes"), kernel.get("flops"), kernel.get("repeat", 1)

    alike = Counter(map(signature, one)) & Counter(map(signature, two))

    def split(program: list[dict]) -> tuple[list[dict], list[dict]]:
        left, kept, rest = Counter(alike), [], []
        for kernel in program:
            if left[signature(kernel)] > 0:
                left[signature(kernel)] -= 1
                kept.append(dict(kernel))
            else:
                rest.append(kernel)
        return kept, rest

    (_, rest_one), (kept, rest_two) = split(one), split(two)
    return kept, rest_one, rest_two


def _grown_together(one: list[dict], two: list[dict], batch: int) -> list[dict]:
    """Memory passes of one op that the two programs split into different numbers of kernels (the unnamed layout
    and cast passes): the batch-2 program's kernels, scaled together so that their bytes and FLOPs are the two
    programs' totals extrapolated to ``batch`` (never below batch 2's)."""
    out = [dict(k) for k in two]
    for name in ("bytes", "flops"):
        first, second = (sum(float(k.get(name, 0.0)) * k.get("repeat", 1) for k in p) for p in (one, two))
        grown = max(first + (second - first) * (batch - 1), second)
        for kernel in out:
            if second > 0 and name in kernel:
                kernel[name] = kernel[name] * grown / second
    return out


def aligned(one: list[dict], two: list[dict], batch: int) -> list[dict]:
    """``extrapolated`` where the two programs differ by a few kernels (a train step's batch-2 program has a layout
    copy or two the batch-1 program does without, and orders its kernels differently).

    The kernels both programs have alike are kept as they are. Many kernels share one op name (the optimizer's
    update of every variable; the unnamed layout passes), and the two programs order them differently: matched
    by position, a train step's update kernels paired different variables (extrapolated as if they grew with
    the batch) or fell out of the match (scaled with it), and BERT-large's AdamW update read 52.8 GB at batch
    24 where every compiled batch has 13.1-13.9. So the other memory passes are matched within each op, smallest with
    smallest, where both programs have as many of them, else grown together (``_grown_together``); convolutions
    and GEMMs in order (difflib). Matched kernels are extrapolated, a kernel only the batch-2 program has is
    scaled with the batch, one only batch 1 has dropped."""
    import difflib

    out, one, two = _unchanged(one, two)
    groups: dict[tuple, tuple[list, list]] = {}
    for program, side in ((one, 0), (two, 1)):
        for kernel in program:
            groups.setdefault(_kernel_key(kernel), ([], []))[side].append(kernel)
    by_size = lambda k: (k.get("bytes", 0.0), k.get("flops", 0.0))  # noqa: E731
    rest_one, rest_two = [], []
    for (kind, _), (small, large) in groups.items():
        if kind == "memory" and small and len(small) == len(large):
            out += extrapolated(sorted(small, key=by_size), sorted(large, key=by_size), batch) or []
        elif kind == "memory" and small and large:
            out += _grown_together(small, large, batch)
        else:  # a convolution or GEMM: its shape (m, n, k) is extrapolated, so it is matched in order
            rest_one += small
            rest_two += large
    matcher = difflib.SequenceMatcher(a=[_kernel_key(k) for k in rest_one], b=[_kernel_key(k) for k in rest_two],
                                      autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            out += extrapolated(rest_one[a0:a1], rest_two[b0:b1], batch) or []
            continue
        for kernel in rest_two[b0:b1]:
            out.append(dict(kernel, **{n: kernel[n] * batch / 2 for n in SCALED if n in kernel and n != "count"}))
    return out


def train_cached(model: str, sequence: int | None, half: bool, loss_scale: bool = False) -> bool:
    """Whether a train step's batch-1 and batch-2 programs are compiled already."""
    return all(train_path(model, sequence, b, half, loss_scale).exists() for b in (1, 2))


def compiled_train_kernels(model: str, sequence: int | None, batch: int, half: bool,
                           loss_scale: bool = False) -> list[dict]:
    """The kernels of one train step at ``batch`` as tbs records a TensorFlow training profile's model cell
    (tbs.backends.tensorflow.training.train_step: forward with training=True, loss, gradients of every trainable
    variable, the optimizer's update, one XLA program), cached on disk."""
    path = train_path(model, sequence, batch, half, loss_scale)
    found = cached_kernels(path)
    if found is not None:
        return found
    from types import SimpleNamespace

    import keras

    from tbs.backends.tensorflow.training import train_step

    keras.mixed_precision.set_global_policy("mixed_float16" if half else "float32")
    try:
        network = build(model, sequence, training=True)
        inputs, targets, loss = train_data(model, network, batch)
        runner = train_step(SimpleNamespace(tf_name="/CPU:0", kind="cpu"), network, inputs, lambda flat: flat[0],
                            targets, loss, lambda: optimizer_of(model, loss_scale), xla=True)
        with recording(path):
            cost = runner.costs()["step"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return kept_kernels(path, cost, f"a {model} train step at batch {batch}")
