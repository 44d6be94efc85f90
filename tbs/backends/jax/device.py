"""A JAX device: placing data, and blocked, compiled calls.

A timed call is one ``jax.jit``: ``lax.fori_loop`` runs the layer n times, with n
a traced argument so every n shares one compilation. The layer's variables are
arguments, bound through Keras's ``StatelessScope`` (the layer's stateless call),
so XLA cannot fold weights into constants. Inside the loop an
``optimization_barrier`` ties the inputs to the iteration counter, so XLA's
loop-invariant code motion cannot hoist the call out of the loop. Each iteration
adds up every element of every output: were only one element consumed, XLA would
fuse an elementwise or gather layer down to computing that element. A sum is
what XLA does with a layer's output inside a whole model too: it fuses the
epilogue (bias, activation) into the consumer instead of writing it out, so the
per-layer times add up to the compiled model. Outputs that are views of an input
(pass-through, reshape) are left out: they cost nothing in a compiled model. The
whole model's outputs are instead the loop's state, written out every iteration as
a returning call writes them and summed once after the loop (``outputs_written``):
its program is then the one a user's call compiles to.
Inputs and weights are placed on the device first, and the runner blocks on the
scalar (``block_until_ready``), never copying activations to the host.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

import numpy as np

from tbs.backends.base import (CalibrationProgram, Device, PlacedStep, ProgramCost, Runner, Source, TracedCalls,
                               TrainingPrograms)
from tbs.backends.jax.capture import host_strings_accepted
from tbs.backends.jax.environment import jax as _jax
from tbs.backends.tensors import is_host_strings

STRINGS_UNSUPPORTED = ("needs TensorFlow string ops: JAX has no string type, so this call cannot be "
                       "compiled or placed on a JAX device")


def _arrays(structure: Any) -> list[Any]:
    jax = _jax()
    return [x for x in jax.tree.leaves(structure) if isinstance(x, jax.Array)]


def _stateless(fn: Callable[..., Any], variables: list[Any]) -> Callable[..., Any]:
    """``fn`` as a pure function of its variables' values (the layer's stateless call) and its tensors.

    Values passed in, not closed over, so XLA cannot fold weights into constants.
    """
    from keras.src.backend import StatelessScope

    def pure(values: list[Any], *tensors: Any) -> Any:
        with StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(*tensors)

    return pure


def _total(outputs: list[Any]) -> Any:
    """A float32 scalar that needs every element of every output."""
    jnp = _jax().numpy
    total = jnp.zeros((), jnp.float32)
    for part in outputs:
        if jnp.iscomplexobj(part):
            part = part.real
        total = total + part.astype(jnp.float32).sum()
    return total


# Primitives whose result XLA lays out as a view of their operand (a bitcast): no work, no copy.
VIEW_PRIMITIVES = frozenset({"reshape", "squeeze", "expand_dims"})


def _views_of_inputs(step: Callable[..., list[Any]], *args: Any) -> list[bool]:
    """For each output of ``step``: is it an input, or an input only reshaped?

    Such outputs (Dropout or random augmentation in inference, Flatten) cost nothing in
    a compiled model; summing them would time a pass over memory that never happens.
    """
    jax = _jax()
    from jax.extend.core import Literal

    jaxpr = jax.make_jaxpr(step)(*args).jaxpr
    views = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        operands = [v for v in eqn.invars if not isinstance(v, Literal)]
        if eqn.primitive.name in VIEW_PRIMITIVES and len(operands) == 1 and operands[0] in views:
            views.update(eqn.outvars)
    return [not isinstance(v, Literal) and v in views for v in jaxpr.outvars]


@functools.lru_cache(maxsize=None)
def _single(device: Any) -> Any:
    """The sharding of an array committed to ``device`` alone."""
    return _jax().sharding.SingleDeviceSharding(device)


class JaxDevice(Device):
    """One ``jax.Device`` (cpu:0, gpu:1, tpu:0)."""

    backend = "jax"
    backward_method = "the VJP of the forward's saved residuals, timed alone (jax.vjp)"
    train_step_memory_factor = 3.5  # measured 3.2 on CPU (cnn_flowers, batch 128)

    def __init__(self, kind: str, index: int, jax_device: Any, description: str = "",
                 memory_bytes: int | None = None) -> None:
        super().__init__(kind, index, description, memory_bytes)
        self.jax_device = jax_device
        self._segments: dict[Any, tuple[Callable[..., Any], list[Any]]] = {}

    def __repr__(self) -> str:
        return f"JaxDevice({self.name}, {self.jax_device})"

    def scope(self) -> AbstractContextManager:
        return _jax().default_device(self.jax_device)

    def fit_model(self, model: Any) -> Any:
        """Keras on JAX takes the cuDNN LSTM whenever the process's default backend is a GPU
        (``use_cudnn="auto"``), whatever device it traces for: on a GPU machine the host CPU's LSTM then
        failed to compile ("MLIR translation rule for primitive 'rnn_fwd' not found for platform cpu",
        seen on an H200). Off the GPU, this copy's LSTMs take the loop any CPU or TPU runs."""
        if self.kind != "gpu":
            for layer in model._flatten_layers(include_self=True, recursive=True):
                if getattr(layer, "use_cudnn", None) == "auto":
                    layer.use_cudnn = False
        return model

    def place(self, structure: Any) -> Any:
        jax = _jax()

        def copy(x: Any) -> Any:
            if is_host_strings(x) or not (hasattr(x, "shape") and hasattr(x, "dtype")):
                return x  # strings have no JAX type: they stay on the host
            return self.put(x)

        placed = jax.tree.map(copy, structure)
        for leaf in jax.tree.leaves(placed):
            if isinstance(leaf, jax.Array):
                leaf.block_until_ready()
        return placed

    def compile_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                        variables: Sequence[Any] = (), outputs_written: bool = False) -> Callable[[int], None]:
        """With ``outputs_written`` an ``optimization_barrier`` stands between the call and the sum, so the
        outputs are materialised as a returning call's are: summed inside the program, a whole model's dots
        were fused with the sum into one XLA:CPU kernel that ran 3-6x slower than the model's own program."""
        jax = _jax()
        variables = list(variables)
        values = self._values_here(variables)
        tensors = [self.put(t) for t in tensors]
        stateless = _stateless(lambda *t: _arrays(call(*t)), variables)

        def step(values: list[Any], tensors: list[Any]) -> list[Any]:
            return stateless(values, *tensors)

        views = _views_of_inputs(step, values, tensors)

        def blocked(n: Any, values: list[Any], tensors: list[Any]) -> Any:
            def body(i: Any, acc: Any) -> Any:
                bound, args, _ = jax.lax.optimization_barrier((values, tensors, i))
                out = step(bound, args)
                return acc + _total([x for x, view in zip(out, views) if not view])

            def written(i: Any, kept: list[Any]) -> list[Any]:
                bound, args, _ = jax.lax.optimization_barrier((values, tensors, i))
                return [x for x, view in zip(step(bound, args), views) if not view]

            if outputs_written:  # each iteration's outputs are the loop's state: written out, summed once after
                shapes = jax.eval_shape(step, values, tensors)
                kept = [jax.numpy.zeros(s.shape, s.dtype) for s, view in zip(shapes, views) if not view]
                return _total(jax.lax.fori_loop(0, n, written, kept))
            return jax.lax.fori_loop(0, n, body, jax.numpy.zeros((), jax.numpy.float32))

        compiled = jax.jit(blocked)

        def runner(n: int) -> None:
            jax.block_until_ready(compiled(np.int32(n), values, tensors))

        return runner

    def harness(self, xla: bool) -> Callable[[int], None]:
        """An empty loop that XLA keeps. The base class's identity returns a view of its input, so nothing was
        summed, XLA deleted the loop, and its cost per iteration read 0 on every device (this CPU, and an H200,
        where the kept loop of a layer cell costs tens of µs an iteration): a scalar negation is summed instead,
        one fused kernel, the least a cell's own loop runs besides its layer."""
        return self.compile_blocked(lambda x: -x, [self.place(np.ones((), np.float32))], xla)

    def trace_calls(self, call: Callable[..., Any], tensors: list[Any], xla: bool, variables: Sequence[Any] = (),
                    calls: int = 3) -> TracedCalls | None:
        """One ``jax.jit`` of the call (weights as arguments), its XLA kernels traced by ``jax.profiler``."""
        from tbs.backends.jax import trace

        variables = list(variables)
        pure = _stateless(lambda *t: _arrays(call(*t)), variables)
        placed = [self.put(t) for t in tensors]
        return trace.trace_calls(_jax().jit(pure), (self._values_here(variables), *placed), calls)

    def compiled_outputs(self, call: Callable[..., list[Any]], tensors: list[Any],
                         variables: Sequence[Any] = ()) -> list[Any] | None:
        """One ``jax.jit`` call: XLA computes only what its outputs need."""
        jax = _jax()
        variables = list(variables)
        pure = _stateless(lambda *t: list(call(*t)), variables)
        return list(jax.jit(pure)(self._values_here(variables), *[self.put(t) for t in tensors]))

    def trace(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any] = ()) -> bool:
        jax = _jax()
        variables = list(variables)
        pure = _stateless(lambda *t: _arrays(call(*t)), variables)
        jax.eval_shape(pure, [self.abstract(v.value) for v in variables], *tensors)
        return True

    def abstract(self, x: Any) -> Any:
        jax = _jax()
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(self.jax_device))

    def program_cost(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                     variables: Sequence[Any] = ()) -> ProgramCost:
        from tbs.backends.jax import analysis

        variables = list(variables)
        pure = _stateless(lambda *t: _arrays(call(*t)), variables)
        jax = _jax()

        def place(x: Any) -> Any:  # a stand-in from ``abstract`` is lowered as it is: there is no data to copy
            return x if isinstance(x, jax.ShapeDtypeStruct) else self.put(x)

        return analysis.program_cost(place, pure, [v.value for v in variables], list(tensors))

    def calibration_programs(self, dtype: str) -> list[CalibrationProgram]:
        from tbs.backends.jax import analysis

        return analysis.calibration_programs(self.kind, self.put, self.compile_blocked, dtype)

    def peak_memory_bytes(self, reset: bool = False) -> int | None:
        """On the CPU the process's peak RSS; on an accelerator its allocator's peak.

        JAX never resets an allocator's peak, so a peak is only known when it rose past the mark
        taken at ``reset`` (None otherwise: an earlier, bigger program set it).
        """
        if self.kind == "cpu":
            from tbs.backends.host import process_peak_bytes

            return process_peak_bytes(reset)
        stats = self.jax_device.memory_stats() or {}
        if reset:
            self._peak_mark = stats.get("peak_bytes_in_use")
            return stats.get("bytes_in_use")
        peak = stats.get("peak_bytes_in_use")
        mark = getattr(self, "_peak_mark", None)
        return peak if peak is not None and (mark is None or peak > mark) else None

    def training_programs(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any],
                          grad_inputs: Sequence[bool], make_optimizer: Callable[[], Any] | None,
                          xla: bool, seed: int = 0, owned: Sequence[bool] | None = None) -> TrainingPrograms:
        from tbs.backends.jax import training

        return training.training_programs(self.put, lambda *t: call(*t), tensors, variables, grad_inputs,
                                          make_optimizer, seed, _arrays, _views_of_inputs, _total, owned)

    def train_step(self, model: Any, tensors: list[Any], rebuild: Callable[[list[Any]], Any], targets: list[Any],
                   loss: Callable[[list[Any], Any], Any], make_optimizer: Callable[[], Any], xla: bool) -> Runner:
        from tbs.backends.jax import training

        return training.train_step(self.put, model, tensors, rebuild, targets, loss, make_optimizer)

    def split_train_runner(self, steps: list[PlacedStep], outputs: list[Source], inputs: list[Any],
                           targets: list[Any], loss: Callable[[list[Any], Any], Any], loss_device: Device,
                           make_optimizer: Callable[[], Any]) -> Runner:
        from tbs.backends.jax import split

        return split.split_train_runner(steps, outputs, inputs, targets, loss, loss_device.put, make_optimizer,
                                        _arrays)

    def put(self, x: Any) -> Any:
        """``x`` copied to this device (the one copy every program here and the split step use); an array already
        here (committed to this device alone) as it is: ``device_put`` of it took 64 µs on this 2-core machine, paid
        by every input of every program call of a split's replay."""
        jax = _jax()
        if isinstance(x, jax.Array) and x.committed and x.sharding == _single(self.jax_device):
            return x
        return jax.device_put(x, self.jax_device)

    def run_segment(self, key: Any, calls: list[Any], run: Callable[..., list[Any]], tensors: list[Any]) -> list[Any]:
        """The run of calls compiled once as one program for this device (their weights here), as a split is
        deployed: one dispatch for the run, not one per call (each call's was ~0.4 ms on an H200, and a replay of
        cnn_flowers' 12 layers on it measured 2.3x its prediction)."""
        jax = _jax()
        compiled = self._segments.get(key)
        if compiled is None:
            variables = list({id(v): v for call in calls for v in getattr(call.op, "variables", ())}.values())

            def program(*tensors: Any) -> list[Any]:
                return run(*tensors, invoke=lambda call, args, kwargs: call.invoke(*args, **kwargs))

            compiled = self._segments[key] = (jax.jit(_stateless(program, variables)), self._values_here(variables))
        fn, values = compiled
        return fn(values, *[self.put(t) for t in tensors])

    def _values_here(self, variables: list[Any]) -> list[Any]:
        """The variables' current values, on this device."""
        return [self.put(v.value) for v in variables]

    def replay_runner(self, replay: Callable[..., Any], tensors: list[Any]) -> Callable[[int], None]:
        """A Python loop of per-call compiled functions (one jit cannot span devices).

        Each pass waits for the one before, as the TensorFlow runner's sequential loop does,
        so passes never overlap across devices.
        """
        jax = _jax()

        def runner(n: int) -> None:
            for _ in range(n):
                jax.block_until_ready(replay(*tensors))

        return runner

    def ran_here(self, call: Any) -> bool:
        return all(x.devices() == {self.jax_device} for x in _arrays(call.outputs))

    def sync(self) -> None:
        """Nothing to wait for: every JAX runner and copy here blocks on its own result."""

    def capture_context(self) -> AbstractContextManager:
        return host_strings_accepted()

    def unsupported_reason(self, tensors: Sequence[Any]) -> str | None:
        return STRINGS_UNSUPPORTED if any(is_host_strings(t) for t in tensors) else None
