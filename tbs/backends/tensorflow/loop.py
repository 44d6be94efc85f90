"""The blocked runner every TensorFlow program is timed with: forward calls, training phases, split steps.

A timed call runs the layer n times inside one ``tf.function`` holding a
``tf.while_loop`` (parallel_iterations=1, so iterations never overlap). Unrolled
copies of the same call would be merged by Grappler; a loop body really runs
every iteration. Each iteration consumes one element of every output, so
nothing is pruned, and the runner waits on one scalar instead of copying
activations back to the host.

parallel_iterations=1 matters (issue 11, tests/test_tf_runner.py): a plain
``tf.while_loop`` runs up to 10 iterations at once, and calls that do not depend
on each other then overlap -- on lm_imdb the next call's single-threaded string
ops run on a second core, so a plain loop reports about 0.7x of one call's time.
That is throughput of overlapped calls, not what one forward pass takes.

Programs are traced without autograph, as Keras 3 compiles its own predict and train
steps (``do_not_convert``): a layer is the graph model.fit would run, and its trace
skips converting every call inside it (most of a small layer's trace time).

``device.py``, ``training.py`` and ``split.py`` all build their runners here, so none
of them needs another's internals (this module needs only a device's name and kind).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from tbs.backends.base import Runner
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow

OVERLAPPED_ITERATIONS = 10  # tf.while_loop's default parallel_iterations: what a plain loop of calls gets


class Placement(Protocol):
    """Where a runner runs: a TensorFlow device name ('/device:CPU:0') and its kind ('cpu', 'gpu', 'tpu')."""

    tf_name: str
    kind: str


def consume(structure: Any) -> Any:
    """A float32 scalar depending on one element of every output tensor (cheap, un-prunable)."""
    tf = _tensorflow()
    total = tf.constant(0.0)
    for part in tf.nest.flatten(structure, expand_composites=True):
        if not isinstance(part, tf.Tensor):
            continue
        head = tf.reshape(part, [-1])[:1]
        if part.dtype == tf.string:
            head = tf.strings.length(head)
        elif part.dtype.is_complex:
            head = tf.math.real(head)
        total += tf.reduce_sum(tf.cast(head, tf.float32))
    return total


def sync(kind: str) -> None:
    """Wait for an accelerator's queued work (a CPU's ops have finished when they return)."""
    if kind != "cpu":
        _tensorflow().test.experimental.sync_devices()


def blocked(where: Placement, call: Callable[..., Any], tensors: list[Any], xla: bool, parallel_iterations: int = 1,
            before_loop: Callable[..., Callable[[], Any]] | None = None) -> Runner:
    """The blocked runner: ``runner(n)`` runs ``call(*tensors)`` n times in one loop on ``where``.

    ``before_loop(*tensors)``, where given, runs once per runner call before the loop and returns
    what each iteration runs (training: a backward from one forward's tape).
    """
    tf = _tensorflow()
    device_name, kind = where.tf_name, where.kind

    def compiled(step: Callable[..., Any]) -> Callable[..., Any]:
        # With XLA, the call is its own XLA computation launched every iteration; compiling
        # the loop too would let XLA hoist the loop-invariant call out of it.
        return tf.function(step, jit_compile=True, autograph=False) if xla else step

    plain = compiled(call)

    @tf.function(jit_compile=False, autograph=False)
    def loop(n: Any, *args: Any) -> Any:
        if before_loop is None:
            iteration = lambda: plain(*args)  # noqa: E731
        else:
            with tf.device(device_name):
                iteration = compiled(before_loop(*args))

        def body(i: Any, acc: Any) -> tuple[Any, Any]:
            with tf.device(device_name):
                out = iteration()
                return i + 1, acc + consume(out)

        return tf.while_loop(lambda i, acc: i < n, body, (tf.constant(0), tf.constant(0.0)),
                             parallel_iterations=parallel_iterations)[1]

    def runner(n: int) -> None:
        result = loop(tf.constant(n, dtype=tf.int32), *tensors)
        sync(kind)
        result.numpy()  # a 4-byte scalar: waits for the device without copying activations

    return runner
