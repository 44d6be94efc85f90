"""Output activations a compiled train step never runs, and how their layers are timed as the step runs them.

A model whose last layer ends in softmax (or sigmoid), trained with a cross-entropy, is trained
from the logits on Keras's TensorFlow backend: the loss reads the logits the activation kept, so
the step computes neither the activation nor its gradient. Timed layer by layer as the model is
written, that activation would be counted in the layer's forward and the loss computed from
probabilities: the per-layer sum then exceeds the step (nn_twins: 2x). So:

- the layer is timed up to its logits (its activation swapped for the identity while its
  programs are traced), and the loss from the logits, as the step runs them;
- the activation is timed alone on the logits, as a row of its own (``dense_1 (softmax)``), shown
  and marked ``in_step = False``: never summed with the rest. A layer that *is* the activation
  (``Activation``, ``Softmax``) keeps its own row, marked the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tbs.backends.base import Device
from tbs.capture.recorder import Capture, LayerCall
from tbs.load.train_setup import TrainingSetup
from tbs.endpoints import GRAPH_OUTPUT


@dataclass
class SkippedActivation:
    """An output activation the step never runs: the loss reads ``logits`` instead of its output."""

    call: LayerCall  # the layer whose output it is
    output_index: int  # which flat model output
    logits: Any
    whole_layer: bool  # the layer is the activation itself: none of it runs in the step

    @property
    def activation_name(self) -> str:
        if self.whole_layer:
            return self.call.type
        return str(getattr(self.call.op.activation, "__name__", "activation"))

    @property
    def row_name(self) -> str:
        """Its own row: the layer itself, or the layer's activation apart."""
        return self.call.name if self.whole_layer else f"{self.call.name} ({self.activation_name})"

    def activate(self, logits: Any) -> Any:
        """The activation on the logits (inside a traced loss, Keras then reads the logits again)."""
        return self.call.invoke(logits) if self.whole_layer else self.call.op.activation(logits)


def skipped_activations(cap: Capture, device: Device, setup: TrainingSetup, targets: list[Any],
                        tensors_fn: Callable[[Any], list[Any]]) -> dict[str, SkippedActivation]:
    """The output activations the step skips, by the name of the layer that applies them."""
    outputs = tensors_fn(cap.outputs)
    reads = device.loss_reads_logits(setup.loss, targets, outputs)
    producers = [e.src for e in cap.edges if e.dst == GRAPH_OUTPUT]
    calls = {c.name: c for c in cap.calls}
    found: dict[str, SkippedActivation] = {}
    for index, (output, read, src) in enumerate(zip(outputs, reads, producers)):
        call = calls.get(src)
        if not read or call is None:
            continue
        logits = getattr(output, "_keras_logits")
        whole = any(x is logits for x in tensors_fn((call.args, call.kwargs)))
        if whole or callable(getattr(call.op, "activation", None)):
            found[call.name] = SkippedActivation(call, index, logits, whole)
    return found


def without_activation(invoke: Callable[..., Any], op: Any) -> Callable[..., Any]:
    """``invoke`` with the layer's activation swapped for the identity while it runs (or is traced)."""
    from tbs.backends import keras as _keras

    identity = _keras().activations.linear

    def call(*flat: Any) -> Any:
        kept = op.activation
        op.activation = identity
        try:
            return invoke(*flat)
        finally:
            op.activation = kept

    return call
