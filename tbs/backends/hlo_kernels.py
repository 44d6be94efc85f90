"""The kernels of a whole compiled program, read from XLA's optimised HLO (text): what a GPU would launch.

After XLA's passes, a program's work is its entry computation's instructions: each fusion is one
kernel (its bytes are its operands plus its outputs: what it reads and writes once, the
intermediate values never leave registers), each convolution or dot a library GEMM, and every
other instruction that moves data (a copy, a transpose, a reduce, a gather) one kernel of its own.
A gather reads the rows it gathers, not its whole table (an embedding's lookup reads batch x tokens rows of a
30522-row table), also through a cast fused on the way; a GPU compile's library call (cuBLAS, cuDNN) streams its
operands and result, not the scratch workspace XLA gives it.
Parameters, constants, bitcasts and tuples launch nothing. A fusion that computes a convolution
or a dot (with its epilogue) is that GEMM, after a pass for any pooling it computes the GEMM's operand with (a
GPU library reads its operands materialised). A while loop's body counts once per known trip.

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

from tbs.backends.hlo_gemms import (DTYPE_BYTES, SHAPE, convolution, cudnn_convolution, dims, dot, library,
                                   library_output_bytes, shape_bytes, target)

# How a profile's kernels were read, recorded in its metadata (``kernel_rules``): 3 (since 2026-11-27) as 2, and a
# pooling a CPU fusion computes inside a convolution's or dot's operand is a pass of its own
# (_producer_passes); 2 (2026-11-27) an ``epilogue`` is an elementwise pass after a GEMM that scales nothing per
# feature (_library_epilogue); 1 (profiles without the key) any elementwise pass after a GEMM, a BatchNorm's
# per-feature scale included.
KERNEL_RULES = 3
# A pooling a CPU fusion computes inside a GEMM's operand: a GPU library cannot take it in (_producer_passes). A
# reduction there (a softmax's row sums the CPU fuses into the attention's second GEMM at 384 tokens in FP32) is a
# GPU pass too, but counted it reads the published latencies worse held out (benchmarks/whole_model.py: with the
# clock still fitted, 92.6% -> 73.1% inside the band; at the base clock, A100 80GB 86% -> 79%); left uncounted.
POOLING = {"reduce-window"}
FREE = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "after-all", "partition-id", "replica-id",
        "iota", "opt-barrier", "add-dependency"}  # nothing launched (an iota is folded into its user)
CONTROL = {"while", "conditional", "call"}
VIEWS = {"bitcast", "broadcast", "reshape"}  # read their operand, compute nothing
ELEMENTWISE = {"parameter", "constant", "broadcast", "add", "subtract", "multiply", "divide", "maximum", "minimum",
               "convert", "tanh", "exponential", "logistic", "erf", "rsqrt", "sqrt", "negate", "select", "compare",
               "clamp", "bitcast", "reshape", "power", "abs"}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_CALLS = re.compile(r"(?:calls|body|to_apply|branch_computations)=\{?%?([\w.\-]+)")


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


def _compute_inside(name: str, computations: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every convolution and dot a fused computation runs, each with the bytes of its own operands and output
    (a GPU runs each as a library kernel of its own: a CPU fusion may chain several), each after the pooling
    passes that compute its operands (_producer_passes)."""
    body = computations.get(name, [])
    by_name = {i["name"]: i for i in body}
    shapes = {n: i["shape"] for n, i in by_name.items()}
    out = []
    for instruction in body:
        if instruction["opcode"] in ("convolution", "dot"):
            out += _producer_passes(instruction, by_name)
            kernel = (convolution if instruction["opcode"] == "convolution" else dot)(instruction, shapes)
            kernel["bytes"] = shape_bytes(instruction["shape"]) + sum(shape_bytes(shapes.get(o, ""))
                                                                      for o in instruction["operands"])
            kernel["op"] = _op_name(instruction["attrs"])
            out.append(kernel)
    return out


def _producer_passes(gemm: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The passes a GPU runs before a convolution or dot that a CPU fusion computes its operands in.

    XLA's CPU backend fuses a max or average pooling (a reduce-window) into the convolution or dot that reads its
    result; a GPU's cuDNN and cuBLAS calls read materialised operands, so there the pooling is a
    pass of its own (XLA:GPU compiled cnn_flowers' two max-poolings so for an H200: profiles/h200/cnn_flowers).
    Each such operand is one memory kernel: it reads what the pooling's chain reads (the fusion's parameters, or
    an earlier GEMM's output in the same fusion; the previous layer's bias and activation on the way) and writes
    the operand the GEMM reads.
    Elementwise producers are left alone (a GPU folds them into the kernel before or the library call)."""
    out = []
    for operand in gemm["operands"]:
        chain, reduces, params, stack = set(), [], set(), [operand]
        while stack:
            name = stack.pop()
            instruction = by_name.get(name)
            if instruction is None or name in chain:
                continue
            chain.add(name)
            if instruction["opcode"] in ("parameter", "convolution", "dot"):  # a GEMM before: written by its call
                params.add(name)
                continue
            if instruction["opcode"] in POOLING:
                reduces.append(instruction)
            stack += instruction["operands"]
        if reduces:
            read = sum(shape_bytes(by_name[p]["shape"]) for p in params if _long_axes(by_name[p]["shape"]) > 1)
            written = shape_bytes(by_name[operand]["shape"])
            out.append({"kind": "memory", "flops": 0.0, "bytes": read + written, "producer": True,
                        "op": _op_name(reduces[0]["attrs"])})
    return out


def _long_axes(shape: str) -> int:
    """How many axes of a shape are longer than one: a scalar 0, a per-feature vector (a bias, a scale) 1."""
    return sum(size > 1 for size in dims(shape))


def _library_epilogue(name: str, computations: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether a fused computation is what a GPU library runs as a GEMM's epilogue: elementwise work alone (a
    bias, an activation, a scale, a residual add) that scales nothing per feature.

    cuDNN's fused convolution computes act(alpha * conv + beta * side + bias) with a per-feature bias but scalar
    alpha and beta, and cuBLASLt's epilogues add a bias and apply an activation: a BatchNorm's per-feature scale
    after a GEMM stays a pass of its own on a GPU (XLA:GPU folds a convolution's bias into cuDNN and leaves
    BatchNorm and ReLU to one loop fusion: tests/programs/h200-resnet50-32-fp32.hlo.gz), where a CPU compile fuses
    them into one loop with the bias. A per-feature vector is an operand with one axis (f32[64], f32[1,1,1,64])
    broadcast along the output's last axis (Keras's channels-last features); a per-row one (a softmax's sums) is
    not one and stays folded (docs/predictions.md says why).
    """
    body = computations.get(name, [])
    if not all(i["opcode"] in ELEMENTWISE for i in body):
        return False
    kinds: dict[str, str] = {}  # value -> uniform (a scalar), vector (one axis), feature (a vector broadcast), full
    for instruction in body:
        opcode, sizes = instruction["opcode"], dims(instruction["shape"])
        rank = len(sizes)
        found = {kinds[o] for o in instruction["operands"] if o in kinds} - {"uniform"}
        if opcode in ("parameter", "constant"):
            axes = None if instruction["shape"].startswith("(") else _long_axes(instruction["shape"])  # a tuple: full
            kind = {0: "uniform", 1: "vector"}.get(axes, "full")
        elif opcode == "broadcast" and found == {"vector"}:  # one value per feature: along the last axis
            kind = "feature" if rank > 1 and f"dimensions={{{rank - 1}}}" in instruction["attrs"] else "full"
        elif opcode in ("multiply", "divide") and "feature" in found and "full" in found:
            return False  # a full tensor scaled per feature: a BatchNorm's scale
        else:  # computed from scalars alone, from per-feature values alone (a rsqrt, a cast), or full
            kind = found.pop() if len(found) == 1 else "uniform" if not found else "full"
        kinds[instruction["name"]] = kind
    return True


def _value_key(instruction: dict[str, Any]) -> tuple[str, str, str] | None:
    """What a fused instruction computes, across kernels: its framework op, opcode and shape (None where XLA
    kept no framework op, or for a parameter, which computes nothing)."""
    name = _op_name(instruction["attrs"])
    if not name or instruction["opcode"] in ("parameter", "constant"):
        return None
    shape = SHAPE.search(instruction["shape"])  # its type and dimensions, not its layout
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


INDEXED = {"gather", "dynamic-slice"}  # read only a slice of their first operand
PASS_THROUGH = {"convert", "bitcast", "reshape", "copy", "negate", "abs"}  # computed only where their reader reads


def _indexed_reads(body: list[dict[str, Any]], operand_bytes: list[float]) -> list[float]:
    """A fusion's operand bytes where it gathers or slices from an operand (an embedding table read through its
    gather, a cast of it on the way): it reads the rows it gathers, not the table. Each parameter read only
    through such a chain is charged the gathered elements at its own type's size (never more than itself)."""
    users: dict[str, list[dict[str, Any]]] = {}
    for instruction in body:
        for operand in instruction["operands"]:
            users.setdefault(operand, []).append(instruction)

    def sliced_elements(name: str, depth: int = 0) -> float | None:
        readers = users.get(name, [])
        if not readers or depth > 8:
            return None
        total = 0.0
        for reader in readers:
            if reader["opcode"] in INDEXED and reader["operands"][0] == name:
                total += math.prod(dims(reader["shape"]) or [1])
            elif reader["opcode"] in PASS_THROUGH:
                found = sliced_elements(reader["name"], depth + 1)
                if found is None:
                    return None
                total += found
            else:
                return None
        return total

    out = list(operand_bytes)
    for instruction in body:
        if instruction["opcode"] != "parameter" or not instruction["argument"].strip().isdigit():
            continue
        index = int(instruction["argument"])
        elements = sliced_elements(instruction["name"]) if 0 <= index < len(out) else None
        if elements is not None:
            out[index] = min(out[index], _slice_bytes(elements, instruction["shape"]))
    return out


def _slice_bytes(elements: float, source_shape: str) -> float:
    """The bytes of ``elements`` read from an array of ``source_shape``'s type."""
    found = SHAPE.search(source_shape)
    return elements * DTYPE_BYTES.get(found.group(1) if found else "", 4)


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
        call = library(attrs) if opcode == "custom-call" else ""
        out_bytes = library_output_bytes(instruction["shape"]) if call else shape_bytes(instruction["shape"])
        operand_bytes = [shape_bytes(shapes.get(o, "")) for o in operands]
        called = _CALLS.search(attrs) if opcode == "fusion" else None
        if called:
            operand_bytes = _indexed_reads(computations.get(called.group(1), []), operand_bytes)
        elif opcode in INDEXED and operands:  # a gather on its own reads its rows of operand 0
            rows = math.prod(dims(instruction["shape"]) or [1])
            operand_bytes[0] = min(operand_bytes[0], _slice_bytes(rows, shapes.get(operands[0], "")))
        moved = out_bytes + sum(operand_bytes)
        if call == "conv":
            found = [dict(cudnn_convolution(instruction, shapes, target(attrs)), bytes=moved)]
        elif opcode == "convolution":
            found = [dict(convolution(instruction, shapes), bytes=moved)]
        elif opcode == "dot" or call == "gemm":
            found = [dict(dot(instruction, shapes), bytes=moved)]
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
            if (called and produced.get(largest)
                    and shape_bytes(shapes.get(largest, "")) == shape_bytes(instruction["shape"])
                    and _library_epilogue(called.group(1), computations)):
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
        return convolution(instruction, shapes)["flops"]
    if instruction["opcode"] == "dot":
        return dot(instruction, shapes)["flops"]
    return float(sum(math.prod(int(d) for d in sizes.split(",") if d) for _, sizes in SHAPE.findall(instruction["shape"])))


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
