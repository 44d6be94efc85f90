"""What a layer asks of an accelerator, in the terms the GPU model prices: kernels, FLOPs, bytes, GEMM shapes.

The same record describes a row of the published reference measurements and a layer of a CPU
profile, so the model fitted on one predicts the other. A profile supplies only what does not
depend on the device it was measured on: the compiler's FLOPs and bytes and the layer's shapes.
Matmul-like layers become the implicit GEMM a GPU library runs (Dense: M = rows, N = units,
K = inputs; Conv: M = batch x output positions, N = filters, K = FLOPs / 2MN, i.e. kernel area x
input channels); a recurrent layer becomes its sequential per-step GEMMs; everything else moves
bytes (an embedding lookup the rows it reads, not the whole table XLA's count holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tbs.backends import compiles_every_program, fused_gpu_rnn_types
from tbs.profiles.roofline import lookup_bytes, sample_elements
from tbs.schema import LayerRecord

GEMM, CONV, RECURRENT, MEMORY = "gemm", "conv", "recurrent", "memory"
MATMUL_CATEGORIES = ("dense", "attention", "conv", "rnn")  # layer categories whose work is GEMMs
KINDS = (GEMM, CONV, RECURRENT, MEMORY)
GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1, "lstm": 4, "gru": 3, "rnn": 1}
# Kernels a non-fused RNN step launches: the recurrent matmul, one fused elementwise kernel, the loop's own.
LOOP_KERNELS_PER_STEP = 3


@dataclass(frozen=True)
class Work:
    """One layer (or one reference kernel) as kernels to run: FLOPs, bytes and the GEMM it is."""

    kind: str  # gemm | conv | recurrent | memory
    flops: float
    bytes: float
    m: int = 0  # the (implicit) GEMM: M x K times K x N; recurrent: one step's GEMM
    n: int = 0
    k: int = 0
    count: int = 1  # independent GEMMs (a batched matmul's batch)
    steps: int = 1  # recurrent: sequential steps, each one GEMM of (m, n, k) plus elementwise
    input_gemm: tuple[int, int, int] | None = None  # recurrent: the inputs' projection, all steps at once
    fused: bool = True  # recurrent: one fused kernel (cuDNN) or a loop of kernels per step
    in_program: bool = False  # recurrent loop: its kernels launched by a compiled program (XLA), not by a framework
    winograd: bool = False  # a 3x3 stride-1 convolution: cuDNN may run it with Winograd's fewer multiplies
    window: int = 1  # conv: the kernel's area (K = window x input channels)
    stride: int = 1  # conv: its gradient of the input spans the input's positions, stride^2 x the output's
    # Tensor cores need input channels in multiples of 8: a half-precision convolution of 3-channel images runs on
    # the CUDA cores at the single-precision rate instead.
    tensor_core_aligned: bool = True
    phase: str = "forward"  # forward: one GEMM; backward: its two gradient GEMMs (dX, dW); training: all three

    def describe(self) -> str:
        if self.kind in (GEMM, CONV):
            return f"{self.kind} {self.m}x{self.n}x{self.k}" + (f" x{self.count}" if self.count > 1 else "")
        if self.kind == RECURRENT:
            return f"{self.steps} steps of {self.m}x{self.n}x{self.k} ({'cuDNN' if self.fused else 'loop'})"
        return f"{self.bytes:.3g} bytes"


def _implicit_gemm(kind: str, flops: float, moved: float, batch: int, out_shape: list[Any],
                   flops_per_gemm_flop: float) -> Work:
    """A Dense/Conv/attention layer's GEMM from its output shape and FLOPs (K = FLOPs / 2MN)."""
    units = out_shape[-1] if isinstance(out_shape[-1], int) and out_shape[-1] > 0 else 1
    positions = sample_elements(list(out_shape[:-1])) or 1
    m, n = batch * positions, units
    k = max(1, round(flops / flops_per_gemm_flop / (2.0 * m * n)))
    return Work(kind, flops, moved, m=m, n=n, k=k)


def _conv_geometry(layer: LayerRecord | None, out_shape: list[Any], k: int) -> dict[str, Any]:
    """A 2D convolution's kernel area, stride, Winograd eligibility (3x3, stride 1) and channel alignment.

    The input channels come from the layer's input shape (K = kernel area x channels); the stride is the one
    that maps the input's height to the output's, with 'same' or 'valid' padding.
    """
    shapes = (layer.input_shapes if layer is not None else None) or []
    if not shapes or len(shapes[0]) != 4 or len(out_shape) != 4:
        return {}
    channels, height, out_height = shapes[0][-1], shapes[0][1], out_shape[1]
    if not all(isinstance(v, int) and v > 0 for v in (channels, height, out_height)):
        return {}
    exact = _window_of_weights(layer, channels, out_shape[-1])  # K as the implicit GEMM runs it, padding included
    depthwise = layer is not None and "Depthwise" in str(layer.type)  # each channel its own window: K is the window
    window = exact or (k if depthwise or k % channels else k // channels)
    implicit = {"k": window if depthwise else window * channels} if exact else {}  # a depthwise K: its window
    side = max(1, round(math.sqrt(window)))
    stride = next((s for s in range(1, 9) if out_height in (-(-height // s), (height - side) // s + 1)), 1)
    return {"window": window, "stride": stride, "winograd": window == 9 and stride == 1 and not depthwise,
            "tensor_core_aligned": channels % 8 == 0, **implicit}


def _window_of_weights(layer: LayerRecord | None, channels: int, filters: Any) -> int | None:
    """A convolution's kernel area from its weights: area x channels x filters (a depthwise kernel's: area x its
    output channels), plus a bias of filters.

    The compiler's FLOPs cannot give it where the padding is 'same': the taps that fall on the padding are not
    counted, so a 3x3 convolution of 64 channels over 56 x 56 has K = 563, not 576 (read as a grouped kernel
    of 563 taps: no Winograd, the wrong input gradient), and EfficientNetB0's 5x5 depthwise kernels read 22 taps.
    None for a grouped or separable kernel, or no weights.
    """
    if layer is None or not layer.params or not isinstance(filters, int) or filters <= 0 \
            or "Separable" in str(layer.type):
        return None
    # a depthwise kernel: one window per output channel (channels x its multiplier), plus a bias of each
    per_window = filters if "Depthwise" in str(layer.type) else channels * filters
    found = [w // per_window for w in (layer.params - filters, layer.params) if w > 0 and w % per_window == 0]
    # With and without a bias both divide where a window's weights are a multiple of the filters (a depthwise
    # kernel: 25 or 26 for a 5x5): the square one is the kernel (k x k), else Keras's default, a bias.
    squares = [w for w in found if math.isqrt(w) ** 2 == w]
    return (squares or found or [None])[0]


def _recurrent(layer: LayerRecord, flops: float, moved: float, batch: int, backend: str) -> Work | None:
    shapes = layer.input_shapes or []
    out = (layer.output_shapes or [[]])[0]
    if not shapes or len(shapes[0]) < 3 or not out:
        return None
    steps, features = shapes[0][1], shapes[0][-1]
    units = out[-1]
    if not all(isinstance(v, int) and v > 0 for v in (steps, features, units)):
        return None
    layer_type = str(layer.type)
    gates = next((g for name, g in GATES.items() if name in layer_type), 1)
    fused = layer_type in fused_gpu_rnn_types(backend)  # cuDNN's fused kernel, or a loop of kernels
    return Work(RECURRENT, flops, moved, m=batch, n=gates * units, k=units, steps=steps,
                input_gemm=(batch * steps, gates * units, features), fused=fused,
                in_program=not fused and compiles_every_program(backend))


# GEMMs of a layer's shape each phase runs: the forward (M, N, K), the gradient of its input
# (M, K, N) and of its weights (K, N, M).
PHASE_GEMMS = {"forward": 1, "backward_data": 1, "backward_weight": 1, "backward": 2, "training": 3}


def work_of(layer: LayerRecord | None, category: str, flops: float, moved: float, batch: int,
            backend: str, training: bool = False) -> Work:
    """The work of one profile row: its layer's shapes (``Profile.layers``), FLOPs and bytes.

    A training row's FLOPs cover forward and backward: a GEMM's gradient is two GEMMs of the
    forward's size, so its forward is a third of them; the backward is priced as two GEMMs.
    """
    out_shapes = (layer.output_shapes if layer is not None else None) or []
    out_shape = out_shapes[0] if out_shapes and isinstance(out_shapes[0], (list, tuple)) else []
    share = 3.0 if training else 1.0
    if category == "rnn" and layer is not None:
        found = _recurrent(layer, flops, moved, batch, backend)
        if found is not None:
            return replace(found, phase="training") if training else found
    if category == "embedding":
        moved = lookup_bytes(layer, moved, batch)
    if category in MATMUL_CATEGORIES and flops > 0:
        kind = CONV if category == "conv" else GEMM
        phase = "training" if training else "forward"
        if len(out_shape) >= 2:
            work = _implicit_gemm(kind, flops, moved, batch, list(out_shape), share)
            geometry = _conv_geometry(layer, list(out_shape), work.k) if kind == CONV else {}
            return Work(work.kind, work.flops, work.bytes, m=work.m, n=work.n, **{"k": work.k, **geometry}, phase=phase)
        side = max(1, round((flops / share / 2.0) ** (1.0 / 3.0)))  # shapes unknown: a cube of the same FLOPs
        return Work(kind, flops, moved, m=side, n=side, k=side, phase=phase)
    return Work(MEMORY, flops, moved)
