"""Training phases on a JAX device: forward with its state carried, the VJP alone, the optimizer's update.

Each phase is one ``jax.jit`` holding a ``lax.fori_loop``, like the forward runner:
- forward: the call with ``training=True`` as a pure function of its trainable and
  state variables; the state it writes (BatchNorm statistics, dropout seed) is the
  loop's carry, so every iteration draws a new mask and none is a hoistable constant;
- backward: ``jax.vjp`` runs the forward once outside the timed loop and returns its
  saved residuals (a pytree); the loop applies that VJP to a cotangent, with residuals
  and cotangent tied to the iteration counter by an ``optimization_barrier`` (else XLA
  hoists the loop-invariant backward and it times as ~0), and sums every gradient (so
  none is pruned). Gradients are asked for the trainable variables and only the inputs
  real training differentiates;
- update: the optimizer's ``stateless_apply`` of fixed gradients, with the variables
  and optimizer slots carried through the loop (the model's own weights never change);
- the whole step: ``stateless_call`` + ``value_and_grad`` + ``stateless_apply``, all
  state carried.
Residual bytes are read from the program itself: the VJP's saved values, less the
weights (counted apart), so an input kept for the backward counts and a weight does not.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tbs.backends.base import Runner, TrainingPrograms
from tbs.backends.jax.environment import jax as _jax


def _bytes(values: Sequence[Any]) -> int:
    return int(sum(np.prod(v.shape, dtype=np.int64) * np.dtype(v.dtype).itemsize for v in values))


def is_float(x: Any) -> bool:
    return np.issubdtype(np.dtype(x.dtype), np.floating)


def pure_call(call: Callable[..., Any], trainable: list[Any], state: list[Any],
          arrays: Callable[[Any], list[Any]]) -> Callable[..., tuple[list[Any], list[Any]]]:
    """``call`` as a pure function: (trainable values, state values, *tensors) -> (outputs, new state)."""
    from keras.src.backend import StatelessScope

    def pure(train_values: list[Any], state_values: list[Any], *tensors: Any) -> tuple[list[Any], list[Any]]:
        mapping = list(zip(trainable, train_values)) + list(zip(state, state_values))
        with StatelessScope(state_mapping=mapping) as scope:
            outputs = arrays(call(*tensors))
            written = [scope.get_current_value(v) for v in state]
        return outputs, [old if new is None else new for old, new in zip(state_values, written)]

    return pure


def _forward(pure: Callable[..., Any], train_values: list[Any], state_values: list[Any], tensors: list[Any],
             views: list[bool], total: Callable[[list[Any]], Any]) -> Runner:
    jax = _jax()

    def blocked(n: Any, train_values: list[Any], state_values: list[Any], tensors: list[Any]) -> Any:
        def body(i: Any, carry: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
            acc, state = carry
            bound, args, _ = jax.lax.optimization_barrier((train_values, tensors, i))
            out, state = pure(bound, state, *args)
            return acc + total([x for x, view in zip(out, views) if not view]), state

        return jax.lax.fori_loop(0, n, body, (jax.numpy.zeros((), jax.numpy.float32), state_values))

    compiled = jax.jit(blocked)
    return lambda n: jax.block_until_ready(compiled(np.int32(n), train_values, state_values, tensors))


def _differentiable(pure: Callable[..., Any], state_values: list[Any], tensors: list[Any],
                    wanted: list[int], float_outputs: list[int]) -> Callable[..., list[Any]]:
    """The floating outputs as a function of (trainable values, the inputs whose gradient is wanted)."""

    def f(train_values: list[Any], wanted_values: list[Any]) -> list[Any]:
        args = list(tensors)
        for i, value in zip(wanted, wanted_values):
            args[i] = value
        outputs, _ = pure(train_values, state_values, *args)
        return [outputs[k] for k in float_outputs]

    return f


def _residual_bytes(f: Callable[..., Any], train_values: list[Any], wanted_values: list[Any]) -> int:
    """Bytes of the values the VJP saves for the backward, weights excluded (they are counted apart)."""
    jax = _jax()
    from jax.extend.core import Literal

    closed = jax.make_jaxpr(lambda t, w: jax.vjp(f, t, w))(train_values, wanted_values)
    jaxpr = closed.jaxpr
    primal_count = len(jax.tree.leaves(jax.eval_shape(f, train_values, wanted_values)))
    weights = set(jaxpr.invars[:len(jax.tree.leaves(train_values))])
    saved = [v for v in jaxpr.outvars[primal_count:] if not isinstance(v, Literal) and v not in weights]
    return _bytes([v.aval for v in saved])


def _backward(f: Callable[..., Any], train_values: list[Any], wanted_values: list[Any],
              cotangents: list[Any]) -> tuple[Runner, Any]:
    """The VJP of saved residuals, timed alone; also returns the gradients (the update's input)."""
    jax = _jax()
    _, vjp = jax.jit(lambda t, w: jax.vjp(f, t, w))(train_values, wanted_values)

    def blocked(n: Any, vjp: Any, cotangents: list[Any]) -> Any:
        def body(i: Any, acc: Any) -> Any:
            saved, g, _ = jax.lax.optimization_barrier((vjp, cotangents, i))
            grads = saved(g)
            return acc + sum(x.astype(jax.numpy.float32).sum() for x in jax.tree.leaves(grads))

        return jax.lax.fori_loop(0, n, body, jax.numpy.zeros((), jax.numpy.float32))

    compiled = jax.jit(blocked)
    grads = jax.jit(lambda v, g: v(g))(vjp, cotangents)
    return (lambda n: jax.block_until_ready(compiled(np.int32(n), vjp, cotangents))), grads


def _update(optimizer: Any, grads: list[Any], train_values: list[Any], slot_values: list[Any]) -> Runner:
    jax = _jax()

    def blocked(n: Any, grads: list[Any], train_values: list[Any], slot_values: list[Any]) -> Any:
        def body(i: Any, carry: tuple[list[Any], list[Any]]) -> tuple[list[Any], list[Any]]:
            values, slots = carry
            g, _ = jax.lax.optimization_barrier((grads, i))
            return optimizer.stateless_apply(slots, g, values)

        return jax.lax.fori_loop(0, n, body, (train_values, slot_values))

    compiled = jax.jit(blocked)
    return lambda n: jax.block_until_ready(compiled(np.int32(n), grads, train_values, slot_values))


def training_programs(place: Callable[[Any], Any], call: Callable[..., Any], tensors: list[Any],
                      variables: Sequence[Any], grad_inputs: Sequence[bool], make_optimizer: Callable[[], Any] | None,
                      seed: int, arrays: Callable[[Any], list[Any]], views_of: Callable[..., list[bool]],
                      total: Callable[[list[Any]], Any], owned: Sequence[bool] | None = None) -> TrainingPrograms:
    """The three phases of ``call(*tensors)`` (see the module docstring); ``place`` puts an array on the device.

    A variable not ``owned`` (a shared layer's, held by its first call) gets its gradient, not its update.
    """
    jax = _jax()
    variables = list(variables)
    owned = [True] * len(variables) if owned is None else list(owned)
    trainable = [v for v in variables if v.trainable]
    updated = [i for i, own in enumerate([own for v, own in zip(variables, owned) if v.trainable]) if own]
    state = [v for v in variables if not v.trainable]
    train_values, state_values = [place(v.value) for v in trainable], [place(v.value) for v in state]
    tensors = [place(t) for t in tensors]
    pure = pure_call(call, trainable, state, arrays)
    views = views_of(lambda values, ts: pure(values[0], values[1], *ts)[0], (train_values, state_values), tensors)
    forward = _forward(pure, train_values, state_values, tensors, views, total)
    shapes, _ = jax.eval_shape(pure, train_values, state_values, *tensors)
    float_outputs = [k for k, s in enumerate(shapes) if is_float(s)]
    wanted = [i for i, (flag, t) in enumerate(zip(grad_inputs, tensors)) if flag and is_float(t)]
    weight_bytes = _bytes([v.value for v, own in zip(variables, owned) if own])
    if not float_outputs or not (trainable or wanted):
        return TrainingPrograms(forward, None, False, None, weight_bytes, 0, None,
                                _forward_cost(pure, train_values, state_values, tensors))
    rng = np.random.default_rng(seed)
    cotangents = [place((1e-3 * rng.standard_normal(shapes[k].shape)).astype(shapes[k].dtype)) for k in float_outputs]
    f = _differentiable(pure, state_values, tensors, wanted, float_outputs)
    wanted_values = [tensors[i] for i in wanted]
    backward, (weight_grads, _) = _backward(f, train_values, wanted_values, cotangents)
    residual_bytes = _residual_bytes(f, train_values, wanted_values)
    costs = _costs(pure, train_values, state_values, tensors, f, wanted_values, cotangents)
    if not updated or make_optimizer is None:
        return TrainingPrograms(forward, backward, False, None, weight_bytes, 0, residual_bytes, costs)
    optimizer = make_optimizer()
    optimizer.build([trainable[i] for i in updated])
    slots = [place(v.value) for v in optimizer.variables]
    grads, values = [weight_grads[i] for i in updated], [train_values[i] for i in updated]
    update = _update(optimizer, grads, values, slots)
    return TrainingPrograms(forward, backward, False, update, weight_bytes, _bytes(slots), residual_bytes,
                            _costs(pure, train_values, state_values, tensors, f, wanted_values, cotangents,
                                   (optimizer, grads, slots), values))


def _forward_cost(pure: Callable[..., Any], train_values: list[Any], state_values: list[Any],
                  tensors: list[Any]) -> Callable[[], dict[str, Any]]:
    from tbs.backends.jax.analysis import lowered_cost

    return lambda: {"forward": lowered_cost(pure, train_values, state_values, *tensors)}


def _costs(pure: Callable[..., Any], train_values: list[Any], state_values: list[Any], tensors: list[Any],
           f: Callable[..., Any], wanted_values: list[Any], cotangents: list[Any],
           update: tuple[Any, list[Any], list[Any]] | None = None,
           updated_values: list[Any] | None = None) -> Callable[[], dict[str, Any]]:
    """XLA's analysis of one call of each phase: the forward, the VJP of saved residuals, the update."""
    from tbs.backends.jax.analysis import lowered_cost

    def costs() -> dict[str, Any]:
        jax = _jax()
        _, vjp = jax.jit(lambda t, w: jax.vjp(f, t, w))(train_values, wanted_values)
        found = {"forward": lowered_cost(pure, train_values, state_values, *tensors),
                 "backward": lowered_cost(lambda v, g: v(g), vjp, cotangents)}
        if update is not None:
            optimizer, grads, slots = update
            found["update"] = lowered_cost(optimizer.stateless_apply, slots, grads, updated_values)
        return found

    return costs


def train_step(place: Callable[[Any], Any], model: Any, tensors: list[Any], rebuild: Callable[[list[Any]], Any],
               targets: list[Any], loss: Callable[[list[Any], Any], Any], make_optimizer: Callable[[], Any]) -> Runner:
    """n whole train steps in one jit: forward, loss (+ the model's own losses), gradients, update."""
    jax = _jax()
    optimizer = make_optimizer()
    optimizer.build(model.trainable_variables)
    train_values = [place(v.value) for v in model.trainable_variables]
    state_values = [place(v.value) for v in model.non_trainable_variables]
    slots = [place(v.value) for v in optimizer.variables]
    tensors, targets = [place(t) for t in tensors], [place(t) for t in targets]

    def compute(train_values: list[Any], state_values: list[Any], inputs: list[Any], ys: list[Any]) -> Any:
        outputs, state_values, losses = model.stateless_call(
            train_values, state_values, rebuild(inputs), training=True, return_losses=True)
        value = loss(ys, outputs)
        return value + sum(losses) if losses else value, state_values

    gradient = jax.value_and_grad(compute, has_aux=True)

    def blocked(n: Any, carry: Any, inputs: list[Any], ys: list[Any]) -> Any:
        def body(i: Any, carry: Any) -> Any:
            acc, values, state, slots = carry
            xs, ts, _ = jax.lax.optimization_barrier((inputs, ys, i))
            (value, state), grads = gradient(values, state, xs, ts)
            values, slots = optimizer.stateless_apply(slots, grads, values)
            return acc + value.astype(jax.numpy.float32), values, state, slots

        return jax.lax.fori_loop(0, n, body, carry)

    compiled = jax.jit(blocked)
    start = (jax.numpy.zeros((), jax.numpy.float32), train_values, state_values, slots)

    def one_step(values: list[Any], state: list[Any], slots: list[Any], xs: list[Any], ts: list[Any]) -> Any:
        (value, state), grads = gradient(values, state, xs, ts)
        return value, optimizer.stateless_apply(slots, grads, values), state

    def costs() -> dict[str, Any]:
        from tbs.backends.jax.analysis import lowered_cost

        return {"step": lowered_cost(one_step, train_values, state_values, slots, tensors, targets)}

    return StepRunner(lambda n: jax.block_until_ready(compiled(np.int32(n), start, tensors, targets)), costs)


class StepRunner:
    """``runner(n)``: n whole train steps; ``runner.costs()``: XLA's analysis of one step."""

    def __init__(self, run: Runner, costs: Callable[[], dict[str, Any]]) -> None:
        self._run, self.costs = run, costs

    def __call__(self, n: int) -> None:
        self._run(n)
