"""What a call costs on a TensorFlow device, from XLA where it compiles, else from TensorFlow's graph statistics.

The analysed program is the call as one XLA computation (``tf.function(jit_compile=True)``,
the body the timed loop runs with --xla). ``experimental_get_compiler_ir`` gives its HLO
before and after XLA's passes; XLA's own cost analysis counts both and its memory analysis
sizes the compiled buffers (tbs.backends.xla). A call XLA cannot compile (string ops) gets
TensorFlow's registered per-op FLOP statistics of its graph instead, and says so.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tbs.backends import xla
from tbs.backends.base import (CALIBRATION_MATMUL_N, CALIBRATION_STREAM_BYTES, CalibrationProgram,
                               ProgramCost)
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow
from tbs.backends.tensorflow.trace import keras_paths, renamer

XLA_SOURCE = "xla (TensorFlow's HLO)"
GRAPH_SOURCE = "tensorflow graph statistics"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def program_cost(device_name: str, kind: str, call: Callable[..., Any], tensors: list[Any]) -> ProgramCost:
    """On a CPU one compile of the HLO gives the optimised counts and the memory; on an accelerator
    TensorFlow's own optimised HLO gives the counts, and the memory is not known."""
    tf = _tensorflow()
    compiled = tf.function(call, jit_compile=True, autograph=False)
    try:
        with tf.device(device_name):
            rename = keras_renamer(compiled, tensors)
            ir = compiled.experimental_get_compiler_ir(*tensors)
            # The CPU's program is compiled again from the unoptimised HLO (the optimised one's layouts
            # do not round-trip), which is also counted as it is: each stage asked is one more lowering.
            # An accelerator's optimised HLO is TensorFlow's own compile for it.
            unoptimised = ir(stage="hlo_serialized" if kind == "cpu" else "hlo")
            optimised = None if kind == "cpu" else ir(stage="optimized_hlo")
    except Exception as exc:  # XLA cannot compile it (string ops): TensorFlow's own statistics
        return graph_cost(call, tensors, f"XLA cannot compile it ({_first_line(exc)})")
    try:
        if kind == "cpu":
            before, after, memory = xla.hlo_compiled(unoptimised, rename=rename)
        else:
            after = dict(xla.hlo_text_cost(optimised), kernels=xla.kernels_of(optimised, rename))
            before, memory = xla.hlo_text_cost(unoptimised), None
    except Exception as exc:  # XLA's analysis is unavailable here (jaxlib missing or changed)
        return graph_cost(call, tensors, f"XLA's cost analysis is unavailable ({_first_line(exc)})")
    reason = "" if memory else "no memory analysis of an accelerator's program through TensorFlow"
    return xla.program_cost(XLA_SOURCE, before, after, memory, reason)


def keras_renamer(compiled: Any, tensors: list[Any]) -> Callable[[str], str] | None:
    """Trace ``compiled`` recording each graph node's Keras call (the compile that follows reuses this trace), as
    a function from an op name to its Keras call path; None where the recording fails (the scopes stay as they are)."""
    try:
        return renamer(keras_paths(compiled, tensors)[1])
    except Exception:  # the recording is an aid to naming: the analysis goes on without it
        return None


def graph_cost(call: Callable[..., Any], tensors: list[Any], why: str) -> ProgramCost:
    """FLOPs from the ops' registered statistics (MatMul, Conv2D...); bytes are not counted there."""
    tf = _tensorflow()
    graph = tf.function(call, autograph=False).get_concrete_function(*tensors).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    stats = tf.compat.v1.profiler.profile(graph=graph, options=options)
    return ProgramCost(source=GRAPH_SOURCE, flops=float(stats.total_float_ops),
                       reason=f"{why}; bytes and memory are not in TensorFlow's graph statistics")


def calibration_programs(kind: str, place: Callable[[Any], Any], compile_blocked: Callable[..., Any],
                         dtype: str) -> list[CalibrationProgram]:
    """A matmul (its FLOP/s) and a sum over a large array (its read bandwidth) in ``dtype``."""
    tf = _tensorflow()
    n = CALIBRATION_MATMUL_N.get(kind, CALIBRATION_MATMUL_N["cpu"])
    rng = np.random.default_rng(0)
    a = place(tf.cast(rng.standard_normal((n, n), np.float32), dtype))
    b = place(tf.cast(rng.standard_normal((n, n), np.float32), dtype))
    itemsize = tf.as_dtype(dtype).size
    count = CALIBRATION_STREAM_BYTES.get(kind, CALIBRATION_STREAM_BYTES["cpu"]) // itemsize
    x = place(tf.ones((count,), dtype))
    return [
        CalibrationProgram("matmul", dtype, compile_blocked(lambda p, q: tf.matmul(p, q), [a, b], False),
                           2.0 * n ** 3, 3.0 * n * n * itemsize),
        CalibrationProgram("stream", dtype, compile_blocked(lambda v: tf.reduce_sum(tf.cast(v, tf.float32)), [x], False),
                           float(count), float(count * itemsize)),
    ]
