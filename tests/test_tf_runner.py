"""The TensorFlow blocked runner times one call after another, never overlapping calls.

Issue 11: on lm_imdb a plain ``tf.function`` holding a ``tf.while_loop`` of the model ran at
about 0.7x tbs's whole-model time per call. The plain loop was the wrong number: by default a
``tf.while_loop`` runs up to 10 iterations at once, and the body's calls do not depend on each
other, so the next call's TextVectorization (single-threaded string ops) runs on the second core
while the current call finishes. That is throughput of overlapped calls, not the time of one
forward pass. ``compile_blocked`` passes parallel_iterations=1; with it, the plain loop agrees
with tbs. A stateless probe that sleeps and counts how many of its calls are running at once shows
the overlap without any timing.
"""

import os
import threading
import time

import numpy as np
import pytest

from keras_models import keras
from tbs.backends.tensorflow.loop import consume
from tbs.backends.tensorflow.discovery import discover
from tbs.backends.tensorflow.environment import tensorflow

tf = tensorflow()
CALLS = 6


class OverlapProbe:
    """A host function that records how many of its calls run at the same time."""

    def __init__(self, seconds: float = 0.02) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self.lock:
            self.running += 1
            self.calls += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)  # releases the GIL: an overlapping call would start meanwhile
        with self.lock:
            self.running -= 1
        return x

    def op(self, x):
        # stateful=False: a stateful op would be ordered after the previous iteration's, hiding overlap
        return tf.numpy_function(self, [x], tf.float32, stateful=False)


def _probe_model(probe: OverlapProbe):
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(4)(inputs)
    outputs = keras.layers.Lambda(lambda t: tf.ensure_shape(probe.op(t), t.shape), name="probe")(hidden)
    return keras.Model(inputs, outputs, name="probe_model")


def _cpu():
    return discover(tpu_timeout_s=0.1).devices[0]


@pytest.mark.parametrize("form", ["function", "keras_model"])
def test_blocked_runner_never_overlaps_calls(form):
    """Every iteration runs, one at a time: what one call takes, not overlapped throughput."""
    device = _cpu()
    probe = OverlapProbe()
    x = device.place(np.ones((2, 4), np.float32))
    if form == "function":
        runner = device.compile_blocked(probe.op, [x], xla=False)
    else:  # as Profiler._model_runner builds the whole-model runner
        model = _probe_model(probe)
        runner = device.compile_blocked(lambda t: model(t, training=False), [x], False, model.variables)
    runner(CALLS)
    assert probe.calls == CALLS  # nothing hoisted out of the loop or merged
    assert probe.most_at_once == 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="overlap needs a second inter-op thread")
def test_probe_sees_a_default_while_loop_overlap_calls():
    """The control: the same probe in a plain while_loop (default parallel_iterations=10) overlaps."""
    probe = OverlapProbe()
    x = _cpu().place(np.ones((2, 4), np.float32))

    @tf.function
    def plain(n, t):
        return tf.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, acc + consume(probe.op(t))),
                             (tf.constant(0), tf.constant(0.0)))[1]

    plain(tf.constant(CALLS), x).numpy()
    assert probe.calls == CALLS
    assert probe.most_at_once >= 2


def test_the_blocked_program_traces_the_call_as_keras_compiles_it_without_autograph():
    """Keras 3's own predict and train steps are ``do_not_convert``: tbs traces a layer the same way
    (and skips autograph's conversion of every call inside it, most of a small layer's trace)."""
    from tensorflow.python.autograph.core import ag_ctx

    seen = []

    def call(x):
        seen.append(ag_ctx.control_status_ctx().status)
        return x * 2.0

    device = discover().devices[0]
    for xla in (False, True):
        device.compile_blocked(call, [tf.constant(np.ones((2, 2), np.float32))], xla)(1)
    assert seen and ag_ctx.Status.ENABLED not in seen, seen
