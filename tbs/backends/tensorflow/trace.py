"""A few whole-model calls traced with ``tf.profiler``, each TensorFlow op with the Keras layer scope it carries.

Without XLA a compiled ``tf.function`` runs graph ops one by one on the executor's threads; the
trace names each ``<node name>:<op type>``. A node's name carries a name scope TensorFlow made unique
(layer ``conv2d`` runs under ``cnn_1/conv2d_1``, layer ``conv2d_1`` under ``cnn_1/conv2d_1_2``), so the
scope alone cannot say which layer it is: while the function is traced, each Keras operation's call
records which graph nodes it created (``keras_paths``), and every node is named by the Keras call path
it came from (``cnn/conv2d_1/convolution``); a node of an inner function (an LSTM's loop body) by its
longest scope prefix whose nodes all came from one call. Each call's ops
are those inside the executor's ``ExecutorState::Process`` events with the call's ``id``. Grappler's
fused ops (a MatMul with its BiasAdd and the next layer's Relu as one ``_FusedMatMul``) carry the
name of the last node they absorbed; the nodes before it that the trace never runs are read from
the function's graph (``absorbed``), so such a kernel is shared between their layers.

With XLA (``--xla``) the call is one XLA cluster whose thunks name HLO instructions; their HLO is
read from the function's optimised HLO (``experimental_get_compiler_ir``) as on JAX.
"""

from __future__ import annotations

import bisect
import tempfile
from pathlib import Path
from typing import Any, Callable

from tbs.backends.base import TracedCalls, TracedOp
from tbs.backends import xla_trace
from tbs.backends.hlo_kernels import instruction_parts
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow

TOOL = "tf.profiler (TensorFlow ops)"
TOOL_XLA = "tf.profiler (XLA kernels)"
Event = tuple[str, str, float, float, dict[str, Any]]  # (line, name, start_ns, duration_ns, stats)


def _events(path: Path) -> list[Event]:
    """Every event of every plane in an XSpace file (TensorFlow's own reader of it)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    out: list[Event] = []
    for plane in space.planes:
        names = plane.event_metadata
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base_ns = line.timestamp_ns
            for event in line.events:
                stats = {stat_names.get(s.metadata_id, ""): _stat_value(s, plane) for s in event.stats}
                out.append((f"{plane.name}/{line.id}", names[event.metadata_id].name,
                            base_ns + event.offset_ps / 1e3, event.duration_ps / 1e3, stats))
    return out


def _stat_value(stat: Any, plane: Any) -> Any:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    return getattr(stat, kind) if kind else None


def graph_ops(events: list[Event]) -> list[list[tuple[str, float, float]]]:
    """The TensorFlow ops of each traced call, in call order: (``node name:op type``, start_ns, end_ns)."""
    processes: dict[str, list[tuple[float, float, Any]]] = {}  # per thread, its executor spans by start
    for line, name, start, duration, stats in events:
        if name == "ExecutorState::Process" and "id" in stats:
            processes.setdefault(line, []).append((start, start + duration, stats["id"]))
    starts = {line: [s for s, _, _ in sorted(spans)] for line, spans in processes.items()}
    spans_by_line = {line: sorted(spans) for line, spans in processes.items()}
    calls: dict[Any, list[tuple[str, float, float]]] = {}
    for line, name, start, duration, _ in events:
        if ":" not in name or name.startswith(("ThreadpoolListener", "ExecutorState")) or "::" in name:
            continue
        at = bisect.bisect_right(starts.get(line, []), start) - 1  # the thread's last span begun by then
        if at < 0:
            continue
        _, last, owner = spans_by_line[line][at]
        if start + duration <= last:
            calls.setdefault(owner, []).append((name, start, start + duration))
    return sorted(calls.values(), key=lambda ops: min(s for _, s, _ in ops))


def xla_ops(events: list[Event]) -> list[list[tuple[str, float, float]]]:
    """The XLA kernels of each traced call (TensorFlow gives every run ``run_id`` -1: a call is the executable's
    ``CpuExecutable::ExecuteAsyncOnStream`` span, or the eager call's, holding them), in call order."""
    spans = [(start, start + duration) for _, name, start, duration, _ in events
             if name == "CpuExecutable::ExecuteAsyncOnStream"]
    spans = spans or [(start, start + duration) for _, name, start, duration, _ in events if name == "EagerExecute"]
    return xla_trace.kernels([(name, start, duration, stats) for _, name, start, duration, stats in events],
                             runs=sorted(spans))


def to_traced(calls: list[list[tuple[str, float, float]]], parts: Callable[[str], list[tuple[str, float]]],
              tool: str) -> TracedCalls:
    """Calls of (op, start_ns, end_ns), the first (the profiler's warm-up) left out, as seconds from the first op."""
    kept = calls[1:]
    origin = min((s for ops in kept for _, s, _ in ops), default=0.0)
    spans, traced = [], []
    for index, ops in enumerate(kept):
        first, last = min(s for _, s, _ in ops), max(e for _, _, e in ops)
        spans.append(((first - origin) / 1e9, (last - first) / 1e9))
        traced += [TracedOp(index, name, (start - origin) / 1e9, (end - start) / 1e9, parts(name))
                   for name, start, end in sorted(ops, key=lambda op: op[1])]
    return TracedCalls(spans, traced, tool)


def trace_calls(function: Any, tensors: list[Any], xla: bool, calls: int) -> TracedCalls | None:
    """``calls`` calls of a compiled ``tf.function`` traced (one warm call and the profiler's warm-up call first)."""
    tf = _tensorflow()
    graph, paths = keras_paths(function, tensors)  # traced first, so each node's Keras call is recorded
    _wait(function(*tensors))  # warm: the first call optimises the graph (Grappler) or compiles it (XLA)
    with tempfile.TemporaryDirectory(prefix="tbs-trace-") as directory:
        tf.profiler.experimental.start(directory)
        try:
            for _ in range(calls + 1):
                _wait(function(*tensors))
        finally:
            tf.profiler.experimental.stop()
        found = sorted(Path(directory).rglob("*.xplane.pb"))
        if not found:
            return None
        events = _events(found[-1])
    named = renamer(paths)
    if xla:
        hlo = function.experimental_get_compiler_ir(*tensors)(stage="optimized_hlo")
        by_instruction = instruction_parts(hlo)
        traced = to_traced(xla_ops(events), lambda name: [(named(n), w) for n, w in by_instruction.get(name, [])],
                           TOOL_XLA)
    else:
        ops = graph_ops(events)
        ran = {name.rsplit(":", 1)[0] for call in ops for name, _, _ in call}
        traced = to_traced(ops, lambda name: [(named(n), w) for n, w in absorbed(graph, name, ran)], TOOL)
    return traced if traced.calls else None


def keras_paths(function: Any, tensors: list[Any]) -> tuple[Any, dict[str, str]]:
    """Trace ``function`` while every Keras operation's call records the graph nodes it creates: its graph, and
    each node's Keras call path (the innermost operation's, its outer ones' names before it).

    Only calls made in the function's own graph are kept: a call inside a loop's or a branch's body (an RNN's
    cell) creates its nodes in that body's graph, whose node positions are not the outer graph's; those nodes
    are named by their scope (``renamer``)."""
    from keras.src.ops.operation import Operation

    original = Operation.__call__
    stack: list[str] = []
    spans: list[tuple[int, int, int, str, Any]] = []  # (depth, first node, end, path, graph)

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        graph = _tensorflow().compat.v1.get_default_graph()
        first = len(graph.get_operations())
        stack.append(str(getattr(self, "name", "")))
        try:
            return original(self, *args, **kwargs)
        finally:
            spans.append((len(stack), first, len(graph.get_operations()), "/".join(stack), graph))
            stack.pop()

    Operation.__call__ = recorded
    try:
        graph = function.get_concrete_function(*tensors).graph
    finally:
        Operation.__call__ = original
    nodes = graph.get_operations()
    owner: list[str | None] = [None] * len(nodes)
    outer = sorted((depth, first, end, path) for depth, first, end, path, where in spans if where is graph)
    for _, first, end, path in outer:  # outer calls first, inner ones overwrite their own nodes
        owner[first:end] = [path] * (end - first)
    return graph, {node.name: path for node, path in zip(nodes, owner) if path}


def renamer(paths: dict[str, str]) -> Callable[[str], str]:
    """A node name as its Keras call path and its own last part; a node the function's graph does not hold (an
    inner function's) by its longest scope prefix whose nodes all came from one call; else as it is."""
    prefixes: dict[str, str | None] = {}
    for name, path in paths.items():
        parts = name.split("/")
        for k in range(1, len(parts)):
            prefix = "/".join(parts[:k])
            prefixes[prefix] = path if prefixes.get(prefix, path) == path else None

    def rename(name: str) -> str:
        if name in paths:
            return f"{paths[name]}/{name.rsplit('/', 1)[-1]}"
        parts = name.split("/")
        for k in range(len(parts) - 1, 0, -1):
            path = prefixes.get("/".join(parts[:k]))
            if path:
                return f"{path}/{'/'.join(parts[k:])}"
        return name

    return rename


# Ops Grappler's remapper folds into one fused kernel (_FusedMatMul, _FusedConv2D, _FusedBatchNormEx, ...).
FUSABLE = {"MatMul", "BatchMatMulV2", "Conv2D", "Conv3D", "DepthwiseConv2dNative", "BiasAdd", "Add", "AddV2", "Mul",
           "Sub", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "FusedBatchNormV3",
           "_MklSwish", "Erf", "Rsqrt"}


CONTRACTIONS = {"MatMul", "BatchMatMulV2", "Conv2D", "Conv3D", "DepthwiseConv2dNative"}


def _work(op: Any) -> float:
    """An op's work as a weight: a matmul's or convolution's FLOPs, else its output's elements."""
    def elements(shape: Any) -> float:
        dims = shape.as_list() if shape.rank is not None else []
        total = 1.0
        for d in dims:
            total *= d or 1
        return total

    out = elements(op.outputs[0].shape) if op.outputs else 1.0
    if op.type in ("MatMul", "BatchMatMulV2") and op.inputs[1].shape.rank:
        return 2.0 * out * (op.inputs[1].shape.as_list()[-2] or 1)
    if op.type.startswith(("Conv", "Depthwise")) and op.inputs[1].shape.rank:
        return 2.0 * out * elements(op.inputs[1].shape) / (op.inputs[1].shape.as_list()[-1] or 1)
    return out


def absorbed(graph: Any, traced: str, ran: set[str]) -> list[tuple[str, float]]:
    """The graph nodes one traced op runs, with their work: itself, and where its type is a fused one
    (``_Fused...``), the nodes feeding it that it absorbed (fusable, and never run on their own)."""
    name, _, kind = traced.rpartition(":")
    try:
        op = graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return [(name, 1.0)]
    found = [(name, _work(op))]
    frontier = [op] if kind.startswith(("_Fused", "_MklFused", "_MklNativeFused")) else []
    while frontier:
        current = frontier.pop()
        for tensor in current.inputs:
            source = tensor.op
            if source.name not in ran and source.type in FUSABLE and all(source.name != n for n, _ in found):
                found.append((source.name, _work(source)))
                if source.type not in CONTRACTIONS:  # a fused kernel starts at its matmul or convolution
                    frontier.append(source)
    return found


def _wait(outputs: Any) -> None:
    """Wait for a call by reading one element of each output (no whole activation copied to the host)."""
    tf = _tensorflow()
    for part in tf.nest.flatten(outputs, expand_composites=True):
        if isinstance(part, tf.Tensor) and part.dtype != tf.string:
            tf.reshape(part, [-1])[:1].numpy()
