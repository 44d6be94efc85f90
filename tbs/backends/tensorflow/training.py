"""Training phases on TensorFlow: a call's forward, backward and optimizer update, and whole train steps.

Every program is a blocked runner built by ``loop.py`` (one ``tf.while_loop``
with parallel_iterations=1 inside a ``tf.function``), as a forward pass is, so a
training phase is timed exactly like one.

A TensorFlow gradient needs the tape that recorded its forward pass, so each
call of the backward runner runs the forward once under a tape, before its
loop, and every iteration runs the gradient ops alone from the saved activations
(``backward_runs_forward_once``; the profiler spreads that one forward out of
the samples). Timing forward+backward and subtracting the forward, as tbs did
before, also subtracts what the two overlap on a second core: a small Dense's
backward came out at a third of its forward. The forward+backward pair is timed
too (``forward_backward``) and bounds the lone backward: a gradient without its
forward in the same graph can miss a rewrite the step gets (oneDNN's max-pool
gradient from its forward's workspace). With --xla each call is one XLA
computation whose ops run one after another, and there the forward+backward
program less the forward is used (``backward_includes_forward``). The gradient
is taken inside the device scope: a gradient runs where it is *called*, not
where its forward ran (tensorflow#33688).

The update program applies fixed, real gradients to *copies* of the trainable
variables with a fresh optimizer: the model's own weights never drift while
they are timed. A whole train step does change the model's weights; its runner
keeps a snapshot and ``restore()`` puts it back.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tbs.backends.base import Runner, TrainingPrograms
from tbs.backends.tensorflow import analysis, loop
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow
from tbs.backends.tensorflow.loop import Placement

COTANGENT_SCALE = 1e-3  # small cotangents keep every gradient finite, whatever the layer
# Ops that read only a tensor's shape: a tensor they consume is not kept alive for its values.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape", "ZerosLike", "OnesLike"})


def _bytes(shape: Any, dtype: Any) -> int | None:
    """Bytes of a dense tensor from its static shape, or None where the shape or the element size is unknown."""
    tf = _tensorflow()
    dtype = tf.as_dtype(dtype)
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined() or dtype.size == 0:  # strings, variants (TensorLists), resources
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64)) * dtype.size


def _float_outputs(structure: Any) -> list[Any]:
    """The floating-point tensors of a call's outputs, in a fixed order (the ones a loss can reach)."""
    tf = _tensorflow()
    return [t for t in tf.nest.flatten(structure)
            if isinstance(t, tf.Tensor) and t.dtype.is_floating]


def _differentiate(call: Callable[..., Any], trainable: list[Any], flagged: list[int], cotangents: Sequence[Any],
                   on_forward: Callable[[], None] = lambda: None) -> Callable[..., Any]:
    """``step(*args) -> (outputs, gradients)``: one forward under a tape, then its backward.

    Unconnected sources give no gradient (there is nothing to compute), so they are left
    out. ``on_forward`` runs between the two (where ``residual_bytes`` marks the forward's end).
    """
    tf = _tensorflow()

    def step(*args: Any) -> tuple[Any, list[Any]]:
        with tf.GradientTape() as tape:
            for i in flagged:
                tape.watch(args[i])
            out = call(*args)
        on_forward()
        sources = trainable + [args[i] for i in flagged]
        grads = tape.gradient(_float_outputs(out), sources, output_gradients=list(cotangents))
        return out, [g for g in grads if g is not None]

    return step


def _backward_from_tape(call: Callable[..., Any], trainable: list[Any], flagged: list[int],
                        cotangents: Sequence[Any]) -> Callable[..., Callable[[], Any]]:
    """``before_loop`` for the backward alone: the forward runs once under a tape, each iteration its gradients.

    The gradient ops read the forward's saved activations (TensorFlow's equivalent of JAX's VJP of
    residuals): timing forward+backward and subtracting the forward would also subtract the work
    the two overlap on a second core, and undercounts small layers' backwards (a Dense's two
    matmuls came out at a third of its one).
    """
    tf = _tensorflow()

    def before_loop(*args: Any) -> Callable[[], Any]:
        with tf.GradientTape() as tape:
            for i in flagged:
                tape.watch(args[i])
            outputs = _float_outputs(call(*args))
        sources = trainable + [args[i] for i in flagged]

        def gradients() -> list[Any]:
            grads = tape.gradient(outputs, sources, output_gradients=list(cotangents))
            return [g for g in grads if g is not None]

        return gradients

    return before_loop


def loss_reads_logits(loss: Callable[[list[Any], Any], Any], targets: list[Any], outputs: list[Any]) -> list[bool]:
    """Per output: does the loss's gradient reach the logits Keras kept on it, and not the output itself?"""
    tf = _tensorflow()
    found = []
    for out in outputs:
        logits = getattr(out, "_keras_logits", None)
        if logits is None:
            found.append(False)
            continue
        with tf.GradientTape() as tape:
            tape.watch([out, logits])
            value = loss(targets, outputs)
        through_output, through_logits = tape.gradient(value, [out, logits])
        found.append(through_output is None and through_logits is not None)
    return found


def _cotangents(floats: Sequence[Any], seed: int) -> list[Any]:
    """Random normal cotangents shaped like each floating output, scaled small, made in the current device scope."""
    tf = _tensorflow()
    rng = np.random.default_rng(seed)
    made = []
    for t in floats:
        values = rng.standard_normal(tuple(t.shape)).astype(np.float32) * COTANGENT_SCALE
        made.append(tf.cast(tf.constant(values), t.dtype))
    return made


def _eager_pass(call: Callable[..., Any], tensors: list[Any], trainable: list[Any],
                seed: int, want_grads: bool) -> tuple[list[Any], list[Any] | None]:
    """Run the call once under a tape: fixes the cotangents (from the real output shapes) and,
    where an update is timed, the real gradients of the trainable variables it applies.

    Like every forward runner, this call advances the layer's state once (BatchNorm statistics, seeds).
    """
    tf = _tensorflow()
    with tf.GradientTape() as tape:
        out = call(*tensors)
    floats = _float_outputs(out)
    cotangents = _cotangents(floats, seed)
    if not (want_grads and floats):
        return cotangents, None
    # Zeros for an unconnected variable: the optimizer still updates it, as it would in training.
    grads = tape.gradient(floats, trainable, output_gradients=cotangents,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return cotangents, list(grads)


def _kept_bytes(graph: Any, forward: set[str], inputs: set[str], cotangents: set[str]) -> int | None:
    """Bytes of the forward tensors the gradient ops read (the residuals), or None if any is unknown.

    Weights (variable handles and reads), constants, captured tensors and the cotangents are
    not residuals; the call's own inputs are. A tensor read only for its shape is not kept.
    """
    tf = _tensorflow()
    kept: dict[str, Any] = {}
    for op in graph.get_operations():
        if op.name in forward or op.type in _SHAPE_ONLY:
            continue
        for t in op.inputs:
            if t.op.name in forward and t.name not in cotangents and not _is_weight(t, inputs, tf):
                kept[t.name] = t
    total = 0
    for t in kept.values():
        size = _bytes(t.shape, t.dtype)
        if size is None:
            return None
        total += size
    return total


def _is_weight(t: Any, inputs: set[str], tf: Any) -> bool:
    """A weight, a constant or a captured value (seen through Identity): not an activation."""
    while t.op.type == "Identity" and t.name not in inputs:
        t = t.op.inputs[0]
    if t.dtype == tf.resource or t.op.type in ("Const", "ReadVariableOp", "VarHandleOp"):
        return True
    return t.op.type == "Placeholder" and t.name not in inputs  # a capture, not one of the call's inputs


def residual_bytes(call: Callable[..., Any], tensors: list[Any], trainable: list[Any], flagged: list[int],
                   cotangents: list[Any]) -> int | None:
    """The activations the backward keeps alive, read from the traced forward+backward graph.

    The call is traced (not run) in a ``tf.function``; ops that exist before ``tape.gradient``
    is called are the forward, ops it adds are the backward. Residuals are forward outputs that
    backward ops read. None where any residual's size is not static (e.g. a while loop's
    TensorList accumulators in an LSTM).
    """
    tf = _tensorflow()
    found: dict[str, Any] = {}

    def traced(args: list[Any], cots: list[Any]) -> list[Any]:
        graph = tf.compat.v1.get_default_graph()
        forward: set[str] = set()
        step = _differentiate(call, trainable, flagged, cots,
                              on_forward=lambda: forward.update(op.name for op in graph.get_operations()))
        _, grads = step(*args)
        found["bytes"] = _kept_bytes(graph, forward, {t.name for t in args}, {t.name for t in cots})
        return grads

    tf.function(traced, autograph=False).get_concrete_function(list(tensors), list(cotangents))
    return found["bytes"]


def _update(device: Placement, trainable: list[Any], grads: list[Any], make_optimizer: Callable[[], Any],
            xla: bool) -> tuple[Runner, int]:
    """A runner applying fixed gradients to copies of the trainable variables, and the optimizer's bytes.

    Each iteration returns the first element of every updated copy (the runner consumes
    them), so the update is a data dependency of the loop's result and cannot be pruned.
    """
    tf = _tensorflow()
    with tf.device(device.tf_name):
        copies = [tf.Variable(v.read_value(), name=v.name.split(":")[0]) for v in trainable]
        optimizer = make_optimizer()
        optimizer.build(copies)

    def apply(*fixed: Any) -> list[Any]:
        optimizer.apply(list(fixed), copies)
        return [tf.reshape(c.read_value(), [-1])[:1] for c in copies]  # read after the update

    slots = sum(_bytes(v.shape, v.dtype) or 0 for v in optimizer.variables)
    runner = loop.blocked(device, apply, grads, xla)
    runner_costs = lambda: analysis.program_cost(device.tf_name, device.kind, apply, list(grads))  # noqa: E731
    return _WithCost(runner, runner_costs), slots


class _WithCost:
    """A runner that can also say what one call of its program costs (XLA's analysis)."""

    def __init__(self, run: Runner, cost: Callable[[], Any]) -> None:
        self._run, self.cost = run, cost

    def __call__(self, n: int) -> None:
        self._run(n)


def training_programs(device: Placement, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any],
                      grad_inputs: Sequence[bool], make_optimizer: Callable[[], Any] | None, xla: bool,
                      seed: int = 0, owned: Sequence[bool] | None = None) -> TrainingPrograms:
    """Compile one call's forward, forward+backward and update runners (see ``Device.training_programs``)."""
    tf = _tensorflow()
    owned = [True] * len(variables) if owned is None else list(owned)
    trainable = [v.value for v in variables if v.trainable]
    updated = [i for i, own in enumerate([own for v, own in zip(variables, owned) if v.trainable]) if own]
    flagged = [i for i, (t, wanted) in enumerate(zip(tensors, grad_inputs))
               if wanted and t.dtype.is_floating]
    weight_bytes = sum(_bytes(v.value.shape, v.value.dtype) or 0 for v, own in zip(variables, owned) if own)
    forward = loop.blocked(device, call, tensors, xla)
    backward = both = update = residuals = None
    slot_bytes = 0
    if trainable or flagged:
        want_update = bool(updated) and make_optimizer is not None
        with tf.device(device.tf_name):
            cotangents, grads = _eager_pass(call, tensors, trainable, seed, want_update)
        if cotangents:
            step = _differentiate(call, trainable, flagged, cotangents)
            if xla:  # one XLA computation per call runs its ops one after another: forward+backward less forward
                backward = loop.blocked(device, step, tensors, xla)
            else:
                backward = loop.blocked(device, call, tensors, xla, 1, _backward_from_tape(call, trainable, flagged,
                                                                                           cotangents))
                both = loop.blocked(device, step, tensors, xla)
            residuals = residual_bytes(call, tensors, trainable, flagged, cotangents)
        if grads is not None and make_optimizer is not None:  # the variables it owns: one update per variable
            update, slot_bytes = _update(device, [trainable[i] for i in updated], [grads[i] for i in updated],
                                         make_optimizer, xla)
    def costs() -> dict[str, Any]:
        found = {"forward": analysis.program_cost(device.tf_name, device.kind, call, list(tensors))}
        if backward is not None:
            found["forward+backward"] = analysis.program_cost(device.tf_name, device.kind, step, list(tensors))
        if update is not None:
            found["update"] = update.cost()
        return found

    return TrainingPrograms(forward=forward, backward=backward, backward_includes_forward=xla,
                            backward_runs_forward_once=not xla, update=update, weight_bytes=weight_bytes,
                            slot_bytes=slot_bytes, residual_bytes=residuals, costs=costs, forward_backward=both)


class TrainStepRunner:
    """``runner(n)``: n whole train steps; ``runner.restore()`` puts back the weights it started from.

    A train step really updates the model (and its optimizer state, which is the runner's own),
    so the profiler calls ``restore()`` once it has timed the runner.
    """

    def __init__(self, blocked: Runner, model: Any) -> None:
        self._blocked = blocked
        self._model = model
        self._saved = model.get_weights()
        self.costs: Callable[[], dict[str, Any]] | None = None  # XLA's analysis of one step

    def __call__(self, n: int) -> None:
        self._blocked(n)

    def restore(self) -> None:
        self._model.set_weights(self._saved)


def train_step(device: Placement, model: Any, tensors: list[Any], rebuild: Callable[[list[Any]], Any],
               targets: list[Any], loss: Callable[[list[Any], Any], Any], make_optimizer: Callable[[], Any],
               xla: bool) -> TrainStepRunner:
    """A runner of whole train steps: forward (training=True), loss plus the model's own losses,
    gradients of every trainable variable and the optimizer's update, one step per loop iteration.

    With ``xla`` the whole step is one XLA computation per iteration (``loop.blocked``).
    """
    tf = _tensorflow()
    trainable = model.trainable_variables
    count = len(tensors)
    with tf.device(device.tf_name):
        optimizer = make_optimizer()
        optimizer.build(trainable)

    def step(*args: Any) -> Any:
        with tf.GradientTape() as tape:
            outputs = model(rebuild(list(args[:count])), training=True)
            value = loss(list(args[count:]), outputs)
            extra = model.losses
            if extra:
                value = value + tf.add_n([tf.cast(x, value.dtype) for x in extra])
        grads = tape.gradient(value, trainable)
        optimizer.apply(grads, trainable)
        return value

    # loop.blocked only defines the program (it traces on the first run): the snapshot is of the start.
    runner = TrainStepRunner(loop.blocked(device, step, list(tensors) + list(targets), xla), model)
    runner.costs = lambda: {"step": analysis.program_cost(device.tf_name, device.kind, step, list(tensors) + list(targets))}
    return runner
