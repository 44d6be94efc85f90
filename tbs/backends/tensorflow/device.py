"""A TensorFlow device: placing data, and blocked, compiled calls.

Every timed program is a blocked runner from ``loop.py`` (one ``tf.while_loop``
with parallel_iterations=1 inside a ``tf.function``; why, there); this class
places data, names the device and hands its calls to the training and split
modules, which build their runners from ``loop.py`` too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

from tbs.backends.base import (CalibrationProgram, Device, PlacedStep, ProgramCost, Runner, Source, TracedCalls,
                               TrainingPrograms)
from tbs.backends.tensorflow import loop, training
from tbs.backends.tensorflow.capture import watch_ops
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow


class TFDevice(Device):
    """A TensorFlow logical device (/device:CPU:0, /device:GPU:1, /device:TPU:0)."""

    backend = "tensorflow"
    backward_method = ("the gradients alone, each sample after one forward under a tape (a TensorFlow gradient "
                       "needs the tape of its forward pass), kept between forward+backward minus the forward and "
                       "forward+backward (timed together, as the step runs them); with --xla the forward+backward "
                       "program minus the forward")
    train_step_memory_factor = 1.0  # measured 0.7 on CPU (cnn_flowers, batch 128)

    def __init__(self, kind: str, index: int, tf_name: str, description: str = "",
                 memory_bytes: int | None = None) -> None:
        super().__init__(kind, index, description, memory_bytes)
        self.tf_name = tf_name

    def __repr__(self) -> str:
        return f"TFDevice({self.name}, {self.tf_name})"

    def scope(self) -> AbstractContextManager:
        return _tensorflow().device(self.tf_name)

    def place(self, structure: Any) -> Any:
        tf = _tensorflow()

        def copy(x: Any) -> Any:
            if not (isinstance(x, (tf.Tensor, tf.Variable)) or (hasattr(x, "shape") and hasattr(x, "dtype"))):
                return x
            is_string = getattr(x, "dtype", None) == tf.string or getattr(getattr(x, "dtype", None), "kind", "") in "OSU"
            # Strings have no device memory on accelerators: they stay on the host, and the
            # string ops that read them run there (reported as cpu-fallback).
            with tf.device("/device:CPU:0") if is_string else self.scope():
                return tf.identity(x) if isinstance(x, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(x)

        return tf.nest.map_structure(copy, structure)

    def compile_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                        variables: Sequence[Any] = (), outputs_written: bool = False) -> Callable[[int], None]:
        """``variables`` are read inside the loop as the resource variables they are. The loop consumes one
        element of each output, which leaves the call's graph as it is (``outputs_written`` changes nothing)."""
        return loop.blocked(self, call, tensors, xla)

    def overlapped_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                           variables: Sequence[Any] = ()) -> Callable[[int], None]:
        """A plain ``tf.while_loop``'s default: up to 10 independent calls at once (throughput)."""
        return loop.blocked(self, call, tensors, xla, parallel_iterations=loop.OVERLAPPED_ITERATIONS)

    def trace_calls(self, call: Callable[..., Any], tensors: list[Any], xla: bool, variables: Sequence[Any] = (),
                    calls: int = 3) -> TracedCalls | None:
        """One ``tf.function`` of the call on this device (XLA-compiled with ``xla``), traced by ``tf.profiler``."""
        from tbs.backends.tensorflow import trace

        tf = _tensorflow()
        with self.scope():
            function = tf.function(call, jit_compile=xla, autograph=False)
            return trace.trace_calls(function, list(tensors), xla, calls)

    def compiled_outputs(self, call: Callable[..., list[Any]], tensors: list[Any],
                         variables: Sequence[Any] = ()) -> list[Any] | None:
        """One ``tf.function`` call: its graph runs only the ops its outputs need."""
        tf = _tensorflow()
        with self.scope():
            return list(tf.function(call, autograph=False)(*tensors))

    def trace(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any] = ()) -> bool:
        with self.scope():
            _tensorflow().function(call, autograph=False).get_concrete_function(*tensors)
        return True

    def abstract(self, x: Any) -> Any:
        tf = _tensorflow()
        return tf.TensorSpec(x.shape, x.dtype) if isinstance(x, tf.Tensor) else x

    def program_cost(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                     variables: Sequence[Any] = ()) -> ProgramCost:
        """XLA's analysis of the call (as --xla compiles it), else TensorFlow's graph statistics."""
        from tbs.backends.tensorflow import analysis

        return analysis.program_cost(self.tf_name, self.kind, call, list(tensors))

    def calibration_programs(self, dtype: str) -> list[CalibrationProgram]:
        from tbs.backends.tensorflow import analysis

        return analysis.calibration_programs(self.kind, self.place, self.compile_blocked, dtype)

    def memory_estimate_note(self, xla: bool) -> str:
        if xla:
            return ""
        return "TensorFlow's graphs (without --xla) hold more than XLA's compiled program, so the real limit is lower"

    def peak_memory_bytes(self, reset: bool = False) -> int | None:
        """On the CPU the process's peak RSS; on a GPU TensorFlow's allocator peak (reset where asked)."""
        if self.kind == "cpu":
            from tbs.backends.host import process_peak_bytes

            return process_peak_bytes(reset)
        tf = _tensorflow()
        name = self.tf_name.split("device:")[-1]
        try:
            if reset:
                tf.config.experimental.reset_memory_stats(name)
            info = tf.config.experimental.get_memory_info(name)
        except (ValueError, RuntimeError):
            return None
        return info["current"] if reset else info["peak"]

    def training_programs(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any],
                          grad_inputs: Sequence[bool], make_optimizer: Callable[[], Any] | None,
                          xla: bool, seed: int = 0, owned: Sequence[bool] | None = None) -> TrainingPrograms:
        """Forward, forward+backward (a gradient needs its tape) and update runners: see training.py."""
        return training.training_programs(self, call, tensors, variables, grad_inputs, make_optimizer, xla, seed,
                                          owned)

    def loss_reads_logits(self, loss: Callable[[list[Any], Any], Any], targets: list[Any],
                          outputs: list[Any]) -> list[bool]:
        return training.loss_reads_logits(loss, targets, outputs)

    def split_train_runner(self, steps: list[PlacedStep], outputs: list[Source], inputs: list[Any],
                           targets: list[Any], loss: Callable[[list[Any], Any], Any], loss_device: Device,
                           make_optimizer: Callable[[], Any]) -> Runner:
        from tbs.backends.tensorflow import split

        return split.split_train_runner(self, steps, outputs, inputs, targets, loss, loss_device, make_optimizer)

    def train_step(self, model: Any, tensors: list[Any], rebuild: Callable[[list[Any]], Any],
                   targets: list[Any], loss: Callable[[list[Any], Any], Any],
                   make_optimizer: Callable[[], Any], xla: bool) -> Runner:
        """Whole train steps; the runner's ``restore()`` puts back the weights the steps changed."""
        return training.train_step(self, model, tensors, rebuild, targets, loss, make_optimizer, xla)

    def run_placed(self, call: Any, args: tuple, kwargs: dict) -> Any:
        with _tensorflow().device(self.tf_name):
            return call.invoke(*args, **kwargs)

    def replay_runner(self, replay: Callable[..., Any], tensors: list[Any]) -> Callable[[int], None]:
        # One graph: tf.device scopes inside it put each call where it was placed.
        return self.compile_blocked(replay, tensors, False)

    def ran_here(self, call: Any) -> bool:
        """Every op of the call (seen in the eager capture here) produced its output on this device."""
        want = self.tf_name.upper().split("DEVICE:")[-1]  # e.g. CPU:1
        seen = [d.upper() for devices in call.op_devices.values() for d in devices if d]
        return all(d.endswith(want) for d in seen)

    def watch_ops(self) -> AbstractContextManager[dict[str, set[str]]]:
        return watch_ops()

    def sync(self) -> None:
        loop.sync(self.kind)
