"""Record every leaf layer's real call arguments from one forward pass.

Keras 3 routes every layer and graph operation call through
``Operation.__call__`` after it has resolved ``training`` and ``mask``; patching
it for the duration of one eager forward pass sees the exact arguments of every
call, whether the model is Sequential, a Functional DAG, nested, or subclassed.
A "leaf" is any operation that is not itself a Model: its inner calls (an LSTM's
cell, an attention layer's projections) belong to it and are not recorded apart.
The same pass records which call produced each tensor, which gives the layer
graph that placement needs. Under a dtype policy (mixed precision) Keras casts a
layer's floating inputs in ``DTypePolicy.convert_input`` before the call: the
recorder watches it too, so an edge is the tensor that really flows between calls
(a float32 model input, a bfloat16 activation), with its producer, dtype and size.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tbs.backends import keras as _keras
from tbs.backends.base import Device
from tbs.capture.categories import categorize
from tbs.endpoints import GRAPH_OUTPUT, input_endpoint
from tbs.schema import LayerRecord
from tbs.backends.tensors import (dtype_name, flatten, fresh_if_passed_through, is_host_strings, iter_tensors,
                         tensor_bytes, tensor_shape)


UNKNOWN_INPUT = input_endpoint("?")  # a tensor traced to no call and to no input of known identity


@dataclass
class Edge:
    """A tensor flowing from one call (or a model input, ``/input/<name>``) into another call (or ``/output``)."""

    src: str
    dst: str
    shape: list[int | None]
    dtype: str
    bytes: int
    inferred: bool = False


@dataclass
class LayerCall(LayerRecord):
    """One leaf call: the profile's record of it (name, type, shapes, bytes...) plus the live call:
    the operation and the exact arguments it received. ``inactive``: every output is one of its
    inputs, so the layer does nothing in this mode (Dropout or random augmentation in inference)
    and its time is the harness's, not work."""

    op: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    outputs: Any = None
    eager_seconds: float = 0.0
    op_devices: dict[str, set[str]] = field(default_factory=dict)
    # Who produced each flat input (a model input's ``input_endpoint`` or a call's name): training needs it to
    # know which inputs' gradients a real backward computes.
    sources: list[str] = field(default_factory=list)

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """Call the operation again (through Keras, so dtype policies still apply)."""
        return self.op(*args, **kwargs)


@dataclass
class Capture:
    calls: list[LayerCall]
    edges: list[Edge]
    outputs: Any


class _Recorder:
    def __init__(self, root: Any, watch_ops: Callable[[], AbstractContextManager[dict[str, set[str]]]]) -> None:
        self.root = root
        self.watch_ops = watch_ops
        self.calls: list[LayerCall] = []
        self.edges: list[Edge] = []
        self.producers: dict[int, str] = {}
        self.keep_alive: list[Any] = []
        self.path: list[str] = []
        self.model_inputs: list[list[Any]] = []
        self.leaf_depth = 0
        self.name_counts: dict[str, int] = {}
        self.cast_from: dict[int, Any] = {}  # a dtype policy's cast of a tensor -> the tensor it was cast from

    def original(self, x: Any) -> Any:
        """The tensor a call's input was cast from by a dtype policy (itself where it was not cast)."""
        while id(x) in self.cast_from:
            x = self.cast_from[id(x)]
        return x

    def watch_casts(self, convert_input: Callable) -> Callable:
        """``DTypePolicy.convert_input`` that remembers each cast it makes (Keras casts inputs there)."""
        recorder = self

        def watched(policy: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
            y = convert_input(policy, x, *args, **kwargs)
            if y is not x:
                recorder.cast_from[id(y)] = x
                recorder.keep_alive.extend([x, y])  # ids stay unique while the pass runs
            return y

        return watched

    def register_inputs(self, inputs: Any, names: list[str]) -> None:
        flat = iter_tensors(inputs)
        for i, x in enumerate(flat):
            name = names[i] if i < len(names) else f"input_{i}"
            self.producers[id(x)] = input_endpoint(name)
            self.keep_alive.append(x)
        self.model_inputs.append(flat)

    def unique_name(self, op: Any) -> str:
        """The call's path of names; an empty Keras name reads "?", so no name starts with "/" (the endpoints')."""
        base = "/".join(part or "?" for part in self.path + [op.name])
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
                    return self.producers.get(id(candidate), UNKNOWN_INPUT), True
        if self.calls:
            return self.calls[-1].name, True
        return UNKNOWN_INPUT, True

    def record(self, op: Any, args: tuple, kwargs: dict, outputs: Any, seconds: float,
               op_devices: dict[str, set[str]], inactive: bool = False, flat_in: list[Any] | None = None) -> None:
        name = self.unique_name(op)
        flat_in = iter_tensors((args, kwargs)) if flat_in is None else flat_in
        flat_out = iter_tensors(outputs)
        seen: set[tuple[str, int]] = set()
        sources = []
        for x in flat_in:
            real = self.original(x)  # what flows into the call; a dtype policy casts it inside
            src, inferred = self.producer_of(real)
            sources.append(src)
            if (src, id(real)) in seen:
                continue
            seen.add((src, id(real)))
            self.edges.append(Edge(src, name, tensor_shape(real), dtype_name(real), tensor_bytes(real), inferred))
        for x in flat_out:
            self.producers[id(x)] = name
        self.keep_alive.extend(flat_in + flat_out)
        params = int(op.count_params()) if getattr(op, "built", False) and hasattr(op, "count_params") else 0
        self.calls.append(
            LayerCall(
                name=name,
                op=op,
                type=type(op).__name__,
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
                inactive=inactive,
                sources=sources,
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
            try:
                with recorder.watch_ops() as op_devices:
                    start = time.perf_counter()
                    outputs = original(op, *args, **kwargs)
                    seconds = time.perf_counter() - start
            finally:
                recorder.leaf_depth -= 1
            flat_in = iter_tensors((args, kwargs))
            given = {id(x) for x in flat_in}
            produced = iter_tensors(outputs)
            inactive = bool(produced) and all(id(x) in given for x in produced)
            outputs = fresh_if_passed_through(outputs, flat_in)
            recorder.record(op, args, kwargs, outputs, seconds, dict(op_devices), inactive, flat_in)
            return outputs

        return hooked


def input_names(model: Any) -> list[str]:
    inputs = getattr(model, "_inputs_struct", None) if hasattr(model, "_inputs_struct") else None
    if inputs is None:
        return ["input"]
    return [getattr(x, "name", f"input_{i}") for i, x in enumerate(flatten(inputs))]


def capture(model: Any, inputs: Any, training: bool, device: Device | None = None,
            record_devices: bool = False) -> Capture:
    """Run one eager forward pass and record every leaf call with its real arguments.

    ``device`` lends its capture context (JAX lets string inputs through); with
    ``record_devices`` it also records where each eager op ran (needed on
    accelerators, where TensorFlow silently falls back to the CPU for ops without
    a kernel).
    """
    from keras.src.dtype_policies.dtype_policy import DTypePolicy
    from keras.src.ops.operation import Operation

    keras = _keras()
    inputs = keras.tree.map_structure(
        lambda x: keras.ops.convert_to_tensor(x) if isinstance(x, np.ndarray) and not is_host_strings(x) else x, inputs)
    watch = device.watch_ops if device is not None and record_devices else (lambda: nullcontext({}))
    recorder = _Recorder(model, watch)
    recorder.register_inputs(inputs, input_names(model))
    original, convert_input = Operation.__call__, DTypePolicy.convert_input
    Operation.__call__ = recorder.hook(original)
    DTypePolicy.convert_input = recorder.watch_casts(convert_input)
    try:
        with device.capture_context() if device is not None else nullcontext():
            outputs = model(inputs, training=training)
    finally:
        Operation.__call__ = original
        DTypePolicy.convert_input = convert_input
    for x in iter_tensors(outputs):
        src, inferred = recorder.producer_of(recorder.original(x))
        recorder.edges.append(Edge(src, GRAPH_OUTPUT, tensor_shape(x), dtype_name(x), tensor_bytes(x), inferred))
    return Capture(calls=recorder.calls, edges=recorder.edges, outputs=outputs)
