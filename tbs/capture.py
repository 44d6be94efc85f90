"""Record every leaf layer's real call arguments from one forward pass.

Keras 3 routes every layer and graph operation call through
``Operation.__call__`` after it has resolved ``training`` and ``mask``; patching
it for the duration of one eager forward pass sees the exact arguments of every
call, whether the model is Sequential, a Functional DAG, nested, or subclassed.
A "leaf" is any operation that is not itself a Model: its inner calls (an LSTM's
cell, an attention layer's projections) belong to it and are not recorded apart.
The same pass records which call produced each tensor, which gives the layer
graph that placement needs.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from tbs.backend import keras as _keras
from tbs.categories import categorize
from tbs.tensors import (dtype_name, flatten, fresh_if_passed_through, is_host_strings, iter_tensors,
                         tensor_bytes, tensor_shape)


@dataclass
class Edge:
    """A tensor flowing from one call (or a model input) into another call."""

    src: str
    dst: str
    shape: list[int | None]
    dtype: str
    bytes: int
    inferred: bool = False


@dataclass
class LayerCall:
    """One leaf call: the operation and the exact arguments it received."""

    name: str
    op: Any
    layer_type: str
    category: str
    params: int
    args: tuple
    kwargs: dict
    outputs: Any
    input_shapes: list[list[int | None]]
    output_shapes: list[list[int | None]]
    input_bytes: int
    output_bytes: int
    eager_seconds: float
    op_devices: dict[str, set[str]] = field(default_factory=dict)

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """Call the operation again (through Keras, so dtype policies still apply)."""
        return self.op(*args, **kwargs)


@dataclass
class Capture:
    calls: list[LayerCall]
    edges: list[Edge]
    outputs: Any


class _OpDeviceRecorder:
    """Collects, per op type, the devices that eager ops' outputs landed on."""

    def __init__(self) -> None:
        self.devices: dict[str, set[str]] = {}

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if isinstance(op_type, bytes):
            op_type = op_type.decode(errors="replace")
        if graph is None:
            for out in outputs or ():
                device = getattr(out, "device", "") or ""
                self.devices.setdefault(op_type, set()).add(device)
        return None


def _op_callbacks() -> Any:
    try:
        from tensorflow.python.framework import op_callbacks  # internal but stable since TF 2.2

        return op_callbacks
    except ImportError:  # pragma: no cover - depends on TF internals
        return None


class _Recorder:
    def __init__(self, root: Any, record_devices: bool) -> None:
        self.root = root
        self.record_devices = record_devices
        self.calls: list[LayerCall] = []
        self.edges: list[Edge] = []
        self.producers: dict[int, str] = {}
        self.keep_alive: list[Any] = []
        self.path: list[str] = []
        self.model_inputs: list[list[Any]] = []
        self.leaf_depth = 0
        self.name_counts: dict[str, int] = {}

    def register_inputs(self, inputs: Any, names: list[str]) -> None:
        flat = iter_tensors(inputs)
        for i, x in enumerate(flat):
            name = names[i] if i < len(names) else f"input_{i}"
            self.producers[id(x)] = f"input:{name}"
            self.keep_alive.append(x)
        self.model_inputs.append(flat)

    def unique_name(self, op: Any) -> str:
        base = "/".join(self.path + [op.name])
        count = self.name_counts.get(base, 0) + 1
        self.name_counts[base] = count
        return base if count == 1 else f"{base}#{count}"

    def producer_of(self, x: Any) -> tuple[str, bool]:
        """Who made tensor x: exact identity, else an enclosing model input, else the last call."""
        if id(x) in self.producers:
            return self.producers[id(x)], False
        shape, dtype = tensor_shape(x), dtype_name(x)
        for inputs in reversed(self.model_inputs):
            for candidate in inputs:
                if tensor_shape(candidate) == shape and dtype_name(candidate) == dtype:
                    return self.producers.get(id(candidate), "input:?"), True
        if self.calls:
            return self.calls[-1].name, True
        return "input:?", True

    def record(self, op: Any, args: tuple, kwargs: dict, outputs: Any, seconds: float,
               op_devices: dict[str, set[str]]) -> None:
        name = self.unique_name(op)
        flat_in = iter_tensors((args, kwargs))
        flat_out = iter_tensors(outputs)
        seen: set[tuple[str, int]] = set()
        for x in flat_in:
            src, inferred = self.producer_of(x)
            if (src, id(x)) in seen:
                continue
            seen.add((src, id(x)))
            self.edges.append(Edge(src, name, tensor_shape(x), dtype_name(x), tensor_bytes(x), inferred))
        for x in flat_out:
            self.producers[id(x)] = name
        self.keep_alive.extend(flat_in + flat_out)
        params = int(op.count_params()) if getattr(op, "built", False) and hasattr(op, "count_params") else 0
        self.calls.append(
            LayerCall(
                name=name,
                op=op,
                layer_type=type(op).__name__,
                category=categorize(type(op)),
                params=params,
                args=args,
                kwargs=kwargs,
                outputs=outputs,
                input_shapes=[tensor_shape(x) for x in flat_in],
                output_shapes=[tensor_shape(x) for x in flat_out],
                input_bytes=sum(tensor_bytes(x) for x in flat_in),
                output_bytes=sum(tensor_bytes(x) for x in flat_out),
                eager_seconds=seconds,
                op_devices=op_devices,
            )
        )

    def hook(self, original: Callable) -> Callable:
        keras = _keras()
        recorder = self

        def hooked(op, *args, **kwargs):
            if recorder.leaf_depth > 0:
                return original(op, *args, **kwargs)
            if isinstance(op, keras.Model):
                is_root = op is recorder.root
                if not is_root:
                    recorder.path.append(op.name)
                    recorder.model_inputs.append(iter_tensors((args, kwargs)))
                try:
                    return original(op, *args, **kwargs)
                finally:
                    if not is_root:
                        recorder.path.pop()
                        recorder.model_inputs.pop()
            recorder.leaf_depth += 1
            devices = _OpDeviceRecorder()
            callbacks = _op_callbacks() if recorder.record_devices else None
            if callbacks is not None:
                callbacks.add_op_callback(devices)
            try:
                start = time.perf_counter()
                outputs = original(op, *args, **kwargs)
                seconds = time.perf_counter() - start
            finally:
                if callbacks is not None:
                    callbacks.remove_op_callback(devices)
                recorder.leaf_depth -= 1
            outputs = fresh_if_passed_through(outputs, iter_tensors((args, kwargs)))
            recorder.record(op, args, kwargs, outputs, seconds, devices.devices)
            return outputs

        return hooked


def input_names(model: Any) -> list[str]:
    inputs = getattr(model, "_inputs_struct", None) if hasattr(model, "_inputs_struct") else None
    if inputs is None:
        return ["input"]
    return [getattr(x, "name", f"input_{i}") for i, x in enumerate(flatten(inputs))]


@contextmanager
def _host_strings_accepted() -> Iterator[None]:
    """Let a Functional model take NumPy string inputs on a backend without strings (JAX).

    Keras converts every model input to its declared dtype first, which fails for
    ``string`` on JAX although the string layers themselves (TextVectorization,
    which runs TensorFlow ops) accept NumPy strings. For the eager capture only,
    string inputs skip that conversion; the rest convert as Keras would.
    """
    from keras.src.models.functional import Functional

    keras = _keras()
    original = Functional._convert_inputs_to_tensors

    def convert(self: Any, flat_inputs: list[Any]) -> list[Any]:
        if not any(is_host_strings(x) for x in flat_inputs):
            return original(self, flat_inputs)
        return [x if x is None or is_host_strings(x) else keras.ops.convert_to_tensor(x, dtype=spec.dtype)
                for x, spec in zip(flat_inputs, self._inputs)]

    Functional._convert_inputs_to_tensors = convert
    try:
        yield
    finally:
        Functional._convert_inputs_to_tensors = original


def capture(model: Any, inputs: Any, training: bool, record_devices: bool = False) -> Capture:
    """Run one eager forward pass and record every leaf call with its real arguments.

    ``record_devices`` also records where each eager op ran (needed on accelerators,
    where ops without a kernel silently fall back to the CPU).
    """
    from keras.src.ops.operation import Operation

    keras = _keras()
    inputs = keras.tree.map_structure(
        lambda x: keras.ops.convert_to_tensor(x) if isinstance(x, np.ndarray) and not is_host_strings(x) else x, inputs)
    recorder = _Recorder(model, record_devices)
    recorder.register_inputs(inputs, input_names(model))
    original = Operation.__call__
    Operation.__call__ = recorder.hook(original)
    try:
        with _host_strings_accepted() if keras.backend.backend() == "jax" else nullcontext():
            outputs = model(inputs, training=training)
    finally:
        Operation.__call__ = original
    for x in iter_tensors(outputs):
        src, inferred = recorder.producer_of(x)
        recorder.edges.append(Edge(src, "output", tensor_shape(x), dtype_name(x), tensor_bytes(x), inferred))
    return Capture(calls=recorder.calls, edges=recorder.edges, outputs=outputs)


