"""A placement's train step run for real on TensorFlow devices (``tbs recommend --verify`` on a training profile).

The split step is one graph, like the inference replay: every call's forward runs
in its device's scope on that device's copy of the model. A TensorFlow gradient runs
where it is *called*, not where its forward ran (tensorflow#33688), so each call is
wrapped in a ``tf.custom_gradient`` whose gradient function computes that call's
gradients inside its own device scope: the backward of each layer then runs on the
layer's device, and only gradients cross devices. Each device's optimizer updates
the variables of the calls placed there, in its scope.
"""

from __future__ import annotations

from typing import Any, Callable

from tbs.backends.base import Device, PlacedStep, Runner, Source
from tbs.backends.tensorflow import loop
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow
from tbs.backends.tensors import iter_tensors, replace_tensors
from tbs.endpoints import GRAPH_INPUT


def _placed(step: PlacedStep, tensors: list[Any]) -> list[Any]:
    """The call's outputs, computed on its device, with a gradient computed on that device too."""
    tf = _tensorflow()
    device_name = step.device.tf_name
    structure = (step.call.args, step.call.kwargs)
    wanted = [i for i, flag in enumerate(step.grad_inputs) if flag]

    @tf.custom_gradient
    def call(*xs: Any) -> Any:
        with tf.device(device_name), tf.GradientTape() as tape:
            for i in wanted:
                tape.watch(xs[i])
            args, kwargs = replace_tensors(structure, list(xs))
            outputs = tf.nest.flatten(step.call.invoke(*args, **kwargs))

        def gradient(*dys: Any, variables: Any = None) -> Any:
            with tf.device(device_name):
                pairs = [(y, dy) for y, dy in zip(outputs, dys) if y.dtype.is_floating and dy is not None]
                sources = [xs[i] for i in wanted] + list(variables or [])
                grads = tape.gradient([y for y, _ in pairs], sources, output_gradients=[dy for _, dy in pairs],
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO) if pairs else \
                    [tf.zeros_like(s) for s in sources]
            by_input = dict(zip(wanted, grads[:len(wanted)]))
            return [by_input.get(i) for i in range(len(xs))], list(grads[len(wanted):])

        return outputs, gradient

    return call(*tensors)


def split_train_runner(host: loop.Placement, steps: list[PlacedStep], outputs: list[Source], inputs: list[Any],
                       targets: list[Any], loss: Callable[[list[Any], Any], Any], loss_device: Device,
                       make_optimizer: Callable[[], Any]) -> Runner:
    """One graph of the placed train step, run by ``host``'s blocked loop (every device here is a TensorFlow one)."""
    tf = _tensorflow()
    groups: dict[str, tuple[Any, list[Any]]] = {}
    seen: set[int] = set()
    for step in steps:
        # A shared layer's variables once, with its first call: the tape sums both calls' gradients.
        variables = [v for v in getattr(step.call.op, "trainable_variables", None) or [] if id(v) not in seen]
        seen.update(id(v) for v in variables)
        if variables:
            groups.setdefault(step.device.name, (step.device, []))[1].extend(variables)
    optimizers = {}
    for name, (device, variables) in groups.items():
        with tf.device(device.tf_name):
            optimizers[name] = make_optimizer()
            optimizers[name].build(variables)
    ys = loss_device.place(list(targets))

    def train_step(*flat: Any) -> Any:
        values: dict[Source, Any] = {(GRAPH_INPUT, i): x for i, x in enumerate(flat)}
        with tf.GradientTape() as tape:
            for step in steps:
                recorded = iter_tensors((step.call.args, step.call.kwargs))
                tensors = [values[src] if src is not None else x for src, x in zip(step.sources, recorded)]
                for k, out in enumerate(_placed(step, tensors)):
                    values[(step.name, k)] = out
            with tf.device(loss_device.tf_name):
                value = loss(ys, [values[src] for src in outputs])
        every = [v for _, variables in groups.values() for v in variables]
        grads = dict(zip([id(v) for v in every], tape.gradient(value, every)))
        total = value
        for name, (device, variables) in groups.items():
            with tf.device(device.tf_name):
                optimizers[name].apply([grads[id(v)] for v in variables], variables)
                total += tf.reduce_sum(tf.reshape(tf.cast(variables[0].value, tf.float32), [-1])[:1])
        return total

    return loop.blocked(host, train_step, list(inputs), False)
