"""What one instruction of an optimised HLO program computes as a GEMM: a dot, an XLA convolution (a weights'
gradient written as one read as such), a GPU compile's cuBLAS or cuDNN call (each cuDNN call keeps its
forward's dim_labels, with its operands in the roles of its kind), and what a library call streams.

Read by tbs.backends.hlo_kernels, which walks the program and prices every other instruction by its bytes.
"""

from __future__ import annotations

import math
import re
from typing import Any

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
SHAPE = re.compile(r"\b(pred|[subfc]\d+|bf16)\[([\d,]*)\]")


def shape_bytes(text: str) -> float:
    """Bytes of every array in a shape (a tuple's elements summed): 'f32[4,16]{1,0}' -> 256."""
    return float(sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in sizes.split(",") if d)
                     for dtype, sizes in SHAPE.findall(text)))


# A convolution whose dimensions could not be read: counted as a kernel, with no work.
UNREAD_CONVOLUTION = {"kind": "conv", "m": 1, "n": 1, "k": 1, "count": 1, "flops": 0.0, "window": 1, "stride": 1,
                      "channels": 1}


def dims(text: str) -> list[int]:
    """The first array's dimensions of a shape."""
    found = SHAPE.search(text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def dimension_list(attrs: str, which: str) -> list[int]:
    """A dot's lhs contracting or batch dimensions, from its attributes or (a cuBLAS call) its backend_config."""
    found = (re.search(rf"lhs_{which}_dims=\{{([\d,]*)\}}", attrs)
             or re.search(rf'"lhs_{which}_dimensions":\[([^\]]*)\]', attrs))
    return [int(d) for d in re.findall(r"\d+", found.group(1))] if found else []


def dot(instruction: dict[str, Any], shapes: dict[str, str]) -> dict[str, Any]:
    """A dot as a GEMM: count = its batch dimensions, K = the contracted ones, M x N the rest of the output."""
    attrs = instruction["attrs"]
    lhs = dims(shapes.get(instruction["operands"][0], "")) if instruction["operands"] else []
    contracting, batch = dimension_list(attrs, "contracting"), dimension_list(attrs, "batch")
    out = dims(instruction["shape"])
    k = math.prod(lhs[d] for d in contracting if d < len(lhs)) or 1
    count = math.prod(lhs[d] for d in batch if d < len(lhs)) or 1
    m = math.prod(d for i, d in enumerate(lhs) if i not in contracting and i not in batch) or 1
    n = max(1, round(math.prod(out) / count / m)) if out else 1
    return {"kind": "gemm", "m": int(m), "n": int(n), "k": int(k), "count": int(count),
            "flops": 2.0 * m * n * k * count}


def convolution(instruction: dict[str, Any], shapes: dict[str, str]) -> dict[str, Any]:
    """A convolution as its implicit GEMM: M = output positions, N = output features, K = window x input channels
    of a group (``dim_labels`` say which dimension is which)."""
    attrs = instruction["attrs"]
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    kernel = dims(shapes.get(instruction["operands"][1], "")) if len(instruction["operands"]) > 1 else []
    out = dims(instruction["shape"])
    if not labels or len(kernel) != len(labels.group(2)) or len(out) != len(labels.group(3)):
        return dict(UNREAD_CONVOLUTION)
    kernel_labels, out_labels = labels.group(2), labels.group(3)
    channels = kernel[kernel_labels.index("i")]
    window = math.prod(d for d, label in zip(kernel, kernel_labels) if label not in "io") or 1
    n = out[out_labels.index("f")]
    m = math.prod(out) // max(n, 1)
    positions = math.prod(d for d, label in zip(out, out_labels) if label.isdigit()) or 1
    if window > positions:  # its "kernel" is an output's gradient and its output a kernel: the weights' gradient
        return weights_gradient(attrs, out[out_labels.index("b")], n, m, window, channels, positions)
    stride = re.search(r"stride=(\d+)", attrs)
    # A transposed convolution (its input dilated by the stride): a GPU library runs it as a convolution's input
    # gradient, which skips the inserted zeros: each output position meets window / dilation of the kernel's taps.
    dilation = re.search(r"lhs_dilate=([\dx]+)", attrs)
    window = max(1, round(window / math.prod(int(d) for d in dilation.group(1).split("x")))) if dilation else window
    return {"kind": "conv", "m": int(m), "n": int(n), "k": int(window * channels), "count": 1,
            "flops": 2.0 * m * n * window * channels, "window": int(window), "stride": int(stride.group(1)) if stride else 1,
            "channels": int(channels)}


def cudnn_convolution(instruction: dict[str, Any], shapes: dict[str, str], call: str) -> dict[str, Any]:
    """A GPU compile's cuDNN call as the convolution GEMM it runs. Each call keeps its forward's ``dim_labels``;
    which array is the forward's input, filter and output depends on the call: a forward reads (input, filter)
    and writes the output, a data gradient reads (output, filter) and writes the input, a filter gradient reads
    (input, output) and writes the filter. The forward as ``convolution`` reads it; the data gradient as the convolution XLA
    writes for it (output positions = the forward's input, the forward's filters as its channels, the stride's
    zeros skipped); the filter gradient as its forward marked ``gradient: weights`` (as ``weights_gradient``)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instruction["attrs"])
    operands = [dims(shapes.get(o, "")) for o in instruction["operands"][:2]]
    result = dims(instruction["shape"])
    if not labels or len(operands) < 2:
        return dict(UNREAD_CONVOLUTION)
    kind = "filter" if "backwardfilter" in call else "input" if "backwardinput" in call else "forward"
    if kind == "forward":  # as XLA's own convolution (a weights' gradient XLA wrote as one is read as such)
        return convolution(instruction, shapes)
    inputs, kernel, out = (result, operands[1], operands[0]) if kind == "input" else (operands[0], result, operands[1])
    input_labels, kernel_labels, out_labels = labels.groups()
    channels, filters = kernel[kernel_labels.index("i")], kernel[kernel_labels.index("o")]
    window = math.prod(d for d, label in zip(kernel, kernel_labels) if label not in "io") or 1
    outputs = math.prod(out) // max(out[out_labels.index("f")], 1)  # batch x output positions
    stride = re.search(r"stride=(\d+)", instruction["attrs"])
    step = int(stride.group(1)) if stride else 1
    flops = 2.0 * outputs * filters * window * channels
    if kind == "input":
        positions = math.prod(inputs) // max(inputs[input_labels.index("f")], 1)
        taps = max(1, round(window / step ** len([c for c in kernel_labels if c.isdigit()])))
        return {"kind": "conv", "m": int(positions), "n": int(channels), "k": int(taps * filters), "count": 1,
                "flops": flops, "window": int(taps), "stride": 1, "channels": int(filters)}
    found = {"kind": "conv", "m": int(outputs), "n": int(filters), "k": int(window * channels), "count": 1,
             "flops": flops, "window": int(window), "stride": step, "channels": int(channels)}
    return dict(found, gradient="weights") if kind == "filter" else found


def weights_gradient(attrs: str, in_channels: int, n: int, m: int, window: int, channels: int,
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


def target(attrs: str) -> str:
    """A custom call's target, lower case ('__cudnn$convbackwardinput'), or ''."""
    found = re.search(r'custom_call_target="([^"]*)"', attrs)
    return found.group(1).lower() if found else ""


def library(attrs: str) -> str:
    """'conv' or 'gemm' for a GPU compile's library call (cuDNN's convolutions, cuBLAS's GEMMs), else ''."""
    name = target(attrs)
    return "conv" if "conv" in name else "gemm" if ("gemm" in name or "matmul" in name) else ""


def library_output_bytes(shape: str) -> float:
    """A cuBLAS or cuDNN call's output bytes without its scratch: XLA:GPU gives each library call a byte array of
    workspace as its tuple's last element (``(f16[128,768], s8[4194304])``), which the kernel does not stream."""
    elements = SHAPE.findall(shape)
    if shape.lstrip().startswith("(") and len(elements) > 1 and elements[-1][0] in ("s8", "u8"):
        elements = elements[:-1]
    return float(sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in sizes.split(",") if d)
                     for dtype, sizes in elements))
