"""The kernels of a whole compiled program, read from XLA's optimised HLO (text): what a GPU would launch.

After XLA's passes, a program's work is its entry computation's instructions: each fusion is one
kernel (its bytes are its operands plus its outputs: what it reads and writes once, the
intermediate values never leave registers), each convolution or dot a library GEMM, and every
other instruction that moves data (a copy, a transpose, a reduce, a gather) one kernel of its own.
Parameters, constants, bitcasts and tuples launch nothing. A fusion that computes a convolution
or a dot (with its epilogue) is that GEMM. A while loop's body counts once per known trip.

The HLO is a CPU compile's (the program tbs analyses on the machine it runs on): its fusion
decisions are the CPU's, which fuse elementwise chains into loops as a GPU's do, but leave a
convolution's bias and activation as a separate pass where XLA's GPU backend can fold them into
cuDNN's epilogue (so the memory passes counted lean high; docs/predictions.md). Where a CPU fusion recomputes a
value an earlier kernel computed (it copies cheap producers into every consumer), the fusion reads that value
instead, if that reads less, as XLA's GPU fusion chooses. The compile keeps half-precision GEMMs in half
precision (tbs.backends.xla.ANALYSIS_DISABLED_PASSES), as a GPU runs them.

Each kernel is a plain dict (it travels in a profile's ``analysis.csv`` as JSON): ``kind`` (gemm,
conv or memory), ``bytes``, ``flops``, the GEMM's ``m``, ``n``, ``k``, ``count`` and for a
convolution its ``window``, ``stride`` and input ``channels`` (a weights' gradient as its forward's, with
``gradient``: ``weights``), and ``op``: the framework op (its
``op_name``, which carries the Keras layer's name scope) that the kernel came from, ``hlo`` its
instruction, and ``repeat`` where a loop runs it more than once.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
FREE = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "after-all", "partition-id", "replica-id",
        "iota", "opt-barrier", "add-dependency"}  # nothing launched (an iota is folded into its user)
CONTROL = {"while", "conditional", "call"}
VIEWS = {"bitcast", "broadcast", "reshape"}  # read their operand, compute nothing
ELEMENTWISE = {"parameter", "constant", "broadcast", "add", "subtract", "multiply", "divide", "maximum", "minimum",
               "convert", "tanh", "exponential", "logistic", "erf", "rsqrt", "sqrt", "negate", "select", "compare",
               "clamp", "bitcast", "reshape", "power", "abs"}
_SHAPE = re.compile(r"\b(pred|[subfc]\d+|bf16)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_CALLS = re.compile(r"(?:calls|body|to_apply|branch_computations)=\{?%?([\w.\-]+)")


def shape_bytes(text: str) -> float:
    """Bytes of every array in a shape (a tuple's elements summed): 'f32[4,16]{1,0}' -> 256."""
    return float(sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
                     for dtype, dims in _SHAPE.findall(text)))


def _dims(text: str) -> list[int]:
    found = _SHAPE.search(text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def parse_module(text: str) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Each computation's instructions (name, shape, opcode, operands, attributes), and the entry's name."""
    computations: dict[str, list[dict[str, Any]]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header and not line.startswith(" "):
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
            continue
        if current is None:
            continue
        found = _INSTRUCTION.match(line)
        if found:
            name, shape, opcode, rest = found.groups()
            depth, end = 1, 0  # the operand list ends at its matching parenthesis
            for end, char in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(char, 0)
                if depth == 0:
                    break
            computations[current].append({"name": name, "shape": shape, "opcode": opcode, "argument": rest[:end],
                                          "operands": re.findall(r"%([\w.\-]+)", rest[:end]), "attrs": rest[end + 1:]})
    return computations, entry


def _op_name(attrs: str) -> str:
    found = re.search(r'op_name="([^"]*)"', attrs)
    return found.group(1) if found else ""


def _dimension_list(attrs: str, which: str) -> list[int]:
    """A dot's lhs contracting or batch dimensions, from its attributes or (a cuBLAS call) its backend_config."""
    found = (re.search(rf"lhs_{which}_dims=\{{([\d,]*)\}}", attrs)
             or re.search(rf'"lhs_{which}_dimensions":\[([^\]]*)\]', attrs))
    return [int(d) for d in re.findall(r"\d+", found.group(1))] if found else []


def _dot(instruction: dict[str, Any], shapes: dict[str, str]) -> dict[str, Any]:
    """A dot as a GEMM: count = its batch dimensions, K = the contracted ones, M x N the rest of the output."""
    attrs = instruction["attrs"]
    lhs = _dims(shapes.get(instruction["operands"][0], "")) if instruction["operands"] else []
    contracting, batch = _dimension_list(attrs, "contracting"), _dimension_list(attrs, "batch")
    out = _dims(instruction["shape"])
    k = math.prod(lhs[d] for d in contracting if d < len(lhs)) or 1
    count = math.prod(lhs[d] for d in batch if d < len(lhs)) or 1
    m = math.prod(d for i, d in enumerate(lhs) if i not in contracting and i not in batch) or 1
    n = max(1, round(math.prod(out) / count / m)) if out else 1
    return {"kind": "gemm", "m": int(m), "n": int(n), "k": int(k), "count": int(count),
            "flops": 2.0 * m * n * k * count}


def _convolution(instruction: dict[str, Any], shapes: dict[str, str]) -> dict[str, Any]:
    """A convolution as its implicit GEMM: M = output positions, N = output features, K = window x input channels
    of a group (``dim_labels`` say which dimension is which)."""
    attrs = instruction["attrs"]
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    kernel = _dims(shapes.get(instruction["operands"][1], "")) if len(instruction["operands"]) > 1 else []
    out = _dims(instruction["shape"])
    if not labels or len(kernel) != len(labels.group(2)) or len(out) != len(labels.group(3)):
        return {"kind": "conv", "m": 1, "n": 1, "k": 1, "count": 1, "flops": 0.0, "window": 1, "stride": 1, "channels": 1}
    kernel_labels, out_labels = labels.group(2), labels.group(3)
    channels = kernel[kernel_labels.index("i")]
    window = math.prod(d for d, label in zip(kernel, kernel_labels) if label not in "io") or 1
    n = out[out_labels.index("f")]
    m = math.prod(out) // max(n, 1)
    positions = math.prod(d for d, label in zip(out, out_labels) if label.isdigit()) or 1
    if window > positions:  # its "kernel" is an output's gradient and its output a kernel: the weights' gradient
        return _weights_gradient(attrs, out[out_labels.index("b")], n, m, window, channels, positions)
    stride = re.search(r"stride=(\d+)", attrs)
    # A transposed convolution (its input dilated by the stride): a GPU library runs it as a convolution's input
    # gradient, which skips the inserted zeros: each output position meets window / dilation of the kernel's taps.
    dilation = re.search(r"lhs_dilate=([\dx]+)", attrs)
    window = max(1, round(window / math.prod(int(d) for d in dilation.group(1).split("x")))) if dilation else window
    return {"kind": "conv", "m": int(m), "n": int(n), "k": int(window * channels), "count": 1,
            "flops": 2.0 * m * n * window * channels, "window": int(window), "stride": int(stride.group(1)) if stride else 1,
            "channels": int(channels)}


def _weights_gradient(attrs: str, in_channels: int, n: int, m: int, window: int, channels: int,
                      positions: int) -> dict[str, Any]:
    """A convolution's weights' gradient (XLA writes it as a convolution of the input with the output's gradient as
    the kernel: a window the output's size, the batch as its input channels) as the forward convolution it is the
    gradient of, marked ``gradient: weights``: a GPU library runs it as that convolution's weight-gradient GEMM
    (M = window x input channels, N = filters, K = batch x output positions, split over K), on tensor cores where
    the forward's input channels allow, not as a convolution whose input has the batch as its channels."""
    dilation = re.search(r"rhs_dilate=(\d+)", attrs)  # the forward's stride dilates the output's gradient
    return {"kind": "conv", "m": int(window * channels), "n": int(n), "k": int(m), "count": 1,
            "flops": 2.0 * m * n * window * channels, "window": int(positions),
            "stride": int(dilation.group(1)) if dilation else 1, "channels": int(in_channels), "gradient": "weights"}


def _compute_inside(name: str, computations: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every convolution and dot a fused computation runs, each with the bytes of its own operands and output
    (a GPU runs each as a library kernel of its own: a CPU fusion may chain several)."""
    body = computations.get(name, [])
    shapes = {i["name"]: i["shape"] for i in body}
    out = []
    for instruction in body:
        if instruction["opcode"] in ("convolution", "dot"):
            kernel = (_convolution if instruction["opcode"] == "convolution" else _dot)(instruction, shapes)
            kernel["bytes"] = shape_bytes(instruction["shape"]) + sum(shape_bytes(shapes.get(o, ""))
                                                                      for o in instruction["operands"])
            kernel["op"] = _op_name(instruction["attrs"])
            out.append(kernel)
    return out


def _elementwise_only(name: str, computations: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether a fused computation is elementwise work alone (a bias, an activation, a scale): what a GPU
    library can run as a GEMM's epilogue."""
    return all(i["opcode"] in ELEMENTWISE for i in computations.get(name, []))


def _value_key(instruction: dict[str, Any]) -> tuple[str, str, str] | None:
    """What a fused instruction computes, across kernels: its framework op, opcode and shape (None where XLA
    kept no framework op, or for a parameter, which computes nothing)."""
    name = _op_name(instruction["attrs"])
    if not name or instruction["opcode"] in ("parameter", "constant"):
        return None
    shape = _SHAPE.search(instruction["shape"])  # its type and dimensions, not its layout
    return name, instruction["opcode"], shape.group(0) if shape else instruction["shape"]


def _bytes_without_recompute(body: list[dict[str, Any]], operand_bytes: list[float], out_bytes: float,
                             computed: set[tuple[str, str, str]]) -> float:
    """A fusion's bytes where it reads, rather than recomputes, values an earlier kernel computed.

    A CPU's fusion copies cheap elementwise producers into every consumer; in a half-precision transformer, whose
    residual stream passes through casts, each layer's normalisation recomputes the whole residual chain from the
    embeddings (BERT-base at 128 tokens: fusions of up to 74 operands). XLA's GPU fusion weighs the bytes a copied
    producer makes its consumers read against those of reading the producer's output, and recomputes only
    where that reads less. So each value an earlier kernel computed (same framework op, opcode and shape) and
    this one computes again is read as that kernel's output: the fusion's bytes are the lesser of the two ways.
    """
    by_name = {i["name"]: i for i in body}
    recomputed = {i["name"] for i in body if _value_key(i) in computed}
    if not recomputed:
        return out_bytes + sum(operand_bytes)
    reads: dict[str, float] = {}

    def read(name: str) -> None:
        source = by_name.get(name)
        if source is None or name in reads:
            return
        if source["opcode"] == "parameter":
            index = int(source["argument"]) if source["argument"].strip().isdigit() else -1
            reads[name] = operand_bytes[index] if 0 <= index < len(operand_bytes) else 0.0
        elif source["opcode"] in VIEWS and source["operands"]:
            read(source["operands"][0])  # a view reads its source
        elif name in recomputed:
            reads[name] = shape_bytes(source["shape"])  # an earlier kernel's output, read back

    for instruction in body:
        if instruction["name"] not in recomputed and instruction["opcode"] != "parameter":
            for operand in instruction["operands"]:
                read(operand)
    return min(out_bytes + sum(operand_bytes), out_bytes + sum(reads.values()))


def _library(attrs: str) -> str:
    """'conv' or 'gemm' for a GPU compile's library call (cuDNN's convolutions, cuBLAS's GEMMs), else ''."""
    target = re.search(r'custom_call_target="([^"]*)"', attrs)
    name = target.group(1).lower() if target else ""
    return "conv" if "conv" in name else "gemm" if ("gemm" in name or "matmul" in name) else ""


def _trips(attrs: str) -> int:
    found = re.search(r'known_trip_count[^0-9]*(\d+)', attrs)
    return int(found.group(1)) if found else 1


def program_kernels(text: str) -> list[dict[str, Any]]:
    """The kernels of an optimised HLO module's entry computation (see the module's docstring)."""
    computations, entry = parse_module(text)
    return _kernels(entry, computations, 1) if entry else []


def _kernels(computation: str, computations: dict[str, list[dict[str, Any]]], repeat: int) -> list[dict[str, Any]]:
    body = computations.get(computation, [])
    shapes = {i["name"]: i["shape"] for i in body}
    produced: dict[str, bool] = {}  # instruction -> whether a convolution or dot wrote it (through bitcasts)
    computed: set[tuple[str, str, str]] = set()  # the values earlier kernels computed (_value_key)
    out: list[dict[str, Any]] = []
    for instruction in body:
        opcode, attrs, operands = instruction["opcode"], instruction["attrs"], instruction["operands"]
        if opcode == "bitcast" and operands:
            produced[instruction["name"]] = produced.get(operands[0], False)
        if opcode in FREE:
            continue
        if opcode in CONTROL:
            trips = _trips(attrs) if opcode == "while" else 1
            for called in _CALLS.findall(attrs):
                out += _kernels(called, computations, repeat * trips)
            continue
        out_bytes, operand_bytes = shape_bytes(instruction["shape"]), [shape_bytes(shapes.get(o, "")) for o in operands]
        moved = out_bytes + sum(operand_bytes)
        called = _CALLS.search(attrs) if opcode == "fusion" else None
        if opcode == "convolution" or (opcode == "custom-call" and _library(attrs) == "conv"):
            found = [dict(_convolution(instruction, shapes), bytes=moved)]
        elif opcode == "dot" or (opcode == "custom-call" and _library(attrs) == "gemm"):
            found = [dict(_dot(instruction, shapes), bytes=moved)]
        else:
            found = _compute_inside(called.group(1), computations) if called else []
        produced[instruction["name"]] = bool(found)
        fused = computations.get(called.group(1), []) if called else [instruction]
        if not found and called:
            moved = _bytes_without_recompute(fused, operand_bytes, out_bytes, computed)
        computed.update(key for key in map(_value_key, fused) if key)
        if not found:
            kernel: dict[str, Any] = {"kind": "memory", "flops": 0.0, "bytes": moved}
            largest = max(operands, key=lambda o: shape_bytes(shapes.get(o, "")), default="")
            if (called and produced.get(largest) and _elementwise_only(called.group(1), computations)
                    and shape_bytes(shapes.get(largest, "")) == shape_bytes(instruction["shape"])):
                kernel["epilogue"] = True  # reads a GEMM's output and writes its size: foldable into the GEMM
            found = [kernel]
        for kernel in found:
            kernel["op"] = kernel.get("op") or _op_name(attrs)
            kernel["hlo"] = opcode
            out.append(dict(kernel, repeat=repeat) if repeat > 1 else kernel)
    return out


def dumps(kernels: list[dict[str, Any]]) -> str:
    """The kernels as compact JSON (one cell of analysis.csv)."""
    return json.dumps(kernels, separators=(",", ":"))


def _work(instruction: dict[str, Any], shapes: dict[str, str]) -> float:
    """What one instruction computes, as a weight: a convolution's or dot's FLOPs, else its output's elements."""
    if instruction["opcode"] == "convolution":
        return _convolution(instruction, shapes)["flops"]
    if instruction["opcode"] == "dot":
        return _dot(instruction, shapes)["flops"]
    return float(sum(math.prod(int(d) for d in dims.split(",") if d) for _, dims in _SHAPE.findall(instruction["shape"])))


def instruction_parts(text: str) -> dict[str, list[tuple[str, float]]]:
    """Every instruction of an optimised HLO module (each one a kernel or thunk a profiler may name), with the
    framework ops it runs: ``(op_name, work)`` for each instruction inside a fusion (its ``op_name`` carries the
    Keras layer's name scope; work as ``_work``), or its own ``op_name`` where it is not a fusion.

    A fusion's parts are what a profiler's one event for it is split by (in-context attribution).
    """
    computations, _ = parse_module(text)

    def parts(computation: str, seen: frozenset[str]) -> list[tuple[str, float]]:
        body = computations.get(computation, [])
        shapes = {i["name"]: i["shape"] for i in body}
        out: list[tuple[str, float]] = []
        for instruction in body:
            called = _CALLS.findall(instruction["attrs"]) if instruction["opcode"] == "fusion" else []
            for inner in called:
                if inner not in seen:
                    out += parts(inner, seen | {inner})
            if not called and instruction["opcode"] not in FREE:
                out.append((_op_name(instruction["attrs"]), _work(instruction, shapes)))
        return out

    found: dict[str, list[tuple[str, float]]] = {}
    for computation, body in computations.items():
        shapes = {i["name"]: i["shape"] for i in body}
        for instruction in body:
            called = _CALLS.findall(instruction["attrs"]) if instruction["opcode"] == "fusion" else []
            inside = [p for inner in called for p in parts(inner, frozenset({inner}))]
            own = (_op_name(instruction["attrs"]), _work(instruction, shapes) or 1.0)
            found[instruction["name"]] = inside or [own]
    return found
