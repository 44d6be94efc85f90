"""A placement's train step run for real on JAX devices (``tbs recommend --verify`` on a training profile).

One jit cannot span devices, so a split step is a Python sequence of per-call
compiled programs, as the inference replay is: each call's forward runs on its
device and returns its VJP (the residuals stay there); the loss runs on its device;
the backward walks the calls in reverse, each VJP on the device that holds its
residuals, with every cotangent copied to it first and every input gradient copied
back to the device of the call that produced that input; then each call's optimizer
update runs where its weights live. Single devices are replayed the same way, so
the comparison is like for like.
"""

from __future__ import annotations

from typing import Any, Callable

from tbs.backends.base import PlacedStep, Runner, Source
from tbs.backends.jax.environment import jax as _jax
from tbs.backends.jax.training import is_float, pure_call
from tbs.backends.tensors import iter_tensors, replace_tensors
from tbs.endpoints import GRAPH_INPUT


class _Call:
    """One placed call's compiled forward (with VJP), backward and update, and its variables' current values."""

    def __init__(self, step: PlacedStep, arrays: Callable[[Any], list[Any]], make_optimizer: Callable[[], Any],
                 updates: bool = True) -> None:
        jax = _jax()
        self.step, self.put = step, step.device.put
        call = step.call
        variables = list(getattr(call.op, "variables", ()))
        trainable = [v for v in variables if v.trainable]
        state = [v for v in variables if not v.trainable]
        self.train_values = [self.put(v.value) for v in trainable]
        self.state_values = [self.put(v.value) for v in state]
        structure = (call.args, call.kwargs)

        def invoke(*tensors: Any) -> Any:
            args, kwargs = replace_tensors(structure, list(tensors))
            return call.invoke(*args, **kwargs)

        pure = pure_call(invoke, trainable, state, arrays)
        self.wanted = [i for i, flag in enumerate(step.grad_inputs) if flag]
        wanted = self.wanted

        def forward(train_values: list[Any], state_values: list[Any], tensors: list[Any]) -> Any:
            def f(values: list[Any], wanted_values: list[Any]) -> Any:
                args = list(tensors)
                for i, value in zip(wanted, wanted_values):
                    args[i] = value
                outputs, new_state = pure(values, state_values, *args)
                floats = [o for o in outputs if is_float(o)]
                return floats, (outputs, new_state)

            floats, vjp, (outputs, new_state) = jax.vjp(f, train_values, [tensors[i] for i in wanted], has_aux=True)
            return outputs, new_state, vjp

        self.forward = jax.jit(forward)
        self.backward = jax.jit(lambda vjp, cotangents: vjp(cotangents))
        self.optimizer = None
        self.trainable = bool(trainable)
        if trainable and updates:
            self.optimizer = make_optimizer()
            self.optimizer.build(trainable)
            self.slots = [self.put(v.value) for v in self.optimizer.variables]
            self.apply = jax.jit(self.optimizer.stateless_apply)
        self.vjp: Any = None
        self.float_index: list[int] = []

    def run_forward(self, values: dict[Source, Any]) -> None:
        recorded = iter_tensors((self.step.call.args, self.step.call.kwargs))
        tensors = [self.put(values[src] if src is not None else x) for src, x in zip(self.step.sources, recorded)]
        outputs, self.state_values, self.vjp = self.forward(self.train_values, self.state_values, tensors)
        self.float_index = [k for k, o in enumerate(outputs) if is_float(o)]
        for k, out in enumerate(outputs):
            values[(self.step.name, k)] = out
        self.shapes = [outputs[k] for k in self.float_index]

    def run_backward(self, cotangents: dict[Source, Any]) -> None:
        jnp = _jax().numpy
        given = [cotangents.get((self.step.name, k)) for k in self.float_index]
        g = [self.put(c) if c is not None else jnp.zeros_like(like) for c, like in zip(given, self.shapes)]
        self.weight_grads, input_grads = self.backward(self.vjp, g)
        for i, grad in zip(self.wanted, input_grads):
            source = self.step.sources[i]
            if source is not None and source[0] != GRAPH_INPUT:
                _accumulate(cotangents, source, grad)

    def run_update(self) -> list[Any]:
        if self.optimizer is None:
            return self.state_values
        self.train_values, self.slots = self.apply(self.slots, self.weight_grads, self.train_values)
        return self.train_values


def _accumulate(cotangents: dict[Source, Any], source: Source, grad: Any) -> None:
    """Gradients reaching one tensor from several consumers add up where the first one landed."""
    jax = _jax()
    if source in cotangents:
        here = cotangents[source]
        cotangents[source] = here + jax.device_put(grad, next(iter(here.devices())))
    else:
        cotangents[source] = grad


def split_train_runner(steps: list[PlacedStep], outputs: list[Source], inputs: list[Any], targets: list[Any],
                       loss: Callable[[list[Any], Any], Any], loss_put: Callable[[Any], Any],
                       make_optimizer: Callable[[], Any], arrays: Callable[[Any], list[Any]]) -> Runner:
    jax = _jax()
    calls: list[_Call] = []
    seen: set[int] = set()
    for step in steps:
        # A shared layer's later call computes its weight gradients, and its first call updates them (once per
        # variable, as a real step does; the update applies that call's share of the gradient, which times the same).
        variables = [id(v) for v in getattr(step.call.op, "variables", ())]
        calls.append(_Call(step, arrays, make_optimizer, updates=not variables or not seen.issuperset(variables)))
        seen.update(variables)
    ys = [loss_put(t) for t in targets]

    def loss_and_gradient(ys: list[Any], outs: list[Any]) -> Any:
        value, vjp = jax.vjp(lambda o: loss(ys, o), outs)
        return value, vjp(jax.numpy.ones_like(value))[0]

    compiled_loss = jax.jit(loss_and_gradient)

    def one_step() -> list[Any]:
        values: dict[Source, Any] = {(GRAPH_INPUT, i): x for i, x in enumerate(inputs)}
        for call in calls:
            call.run_forward(values)
        value, output_grads = compiled_loss(ys, [loss_put(values[src]) for src in outputs])
        cotangents: dict[Source, Any] = {}
        for src, grad in zip(outputs, output_grads):
            if src[0] != GRAPH_INPUT:
                _accumulate(cotangents, src, grad)
        for call in reversed(calls):
            if call.wanted or call.trainable:
                call.run_backward(cotangents)
        return [value] + [call.run_update() for call in calls]

    def runner(n: int) -> None:
        for _ in range(n):
            jax.block_until_ready(one_step())

    return runner

