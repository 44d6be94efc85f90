"""A whole model on a GPU from its compiled program: the fused program's kernels, each priced by the GPU model.

A model timed layer by layer pays every layer's memory passes and launches; the compiled model
fuses its elementwise work (BatchNorm in inference, activations, biases, residual adds) into a few
passes, and the framework pays its per-step host cost once. So the whole model is predicted from
the kernels of its optimised whole-model program (``tbs.backends.hlo_kernels``, recorded in a
profile's ``analysis.csv``): each convolution or dot priced as the GEMM it is (the same model as a
layer's, tbs.predictions.gpu_model), each other kernel as the bytes it moves, every kernel at the clock
a GPU sustains under steady load and paying the launch interval of kernels run back to back, TF32 work
at the share of its peak the published stacks reached, plus a per-step host overhead: the clock set at base,
three constants fitted on published whole-model latencies (tbs/predictions/reference/whole_models.csv,
``python benchmarks/whole_model.py``). Each kernel is attributed to the Keras layer whose name scope its
framework op carries: a layer's share of the whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Iterable

import numpy as np
import pandas as pd

from tbs.measure.in_context import layer_of
from tbs.predictions.bands import TARGET_COVERAGE
from tbs.predictions.gpu_model import PROGRAM_KERNEL_S, GpuModel, GpuSpec, frame_of, predict_frame
from tbs.predictions.work import CONV, GEMM, MEMORY, Work

# A compiled program on a GPU, unlike one kernel timed alone, fitted on the published whole-model latencies of the
# non-classifier models (benchmarks/whole_model.py; each model is scored with the constants fitted without it):
# - KERNEL_S: what each kernel of the program costs beyond its work. The program's kernels are launched back to back
#   from one host thread, so each costs the launch interval (a few microseconds), not the GPU model's launch_s
#   (16 us: NeuSight timed each kernel alone between CUDA events, which adds the event and synchronisation cost).
# - HOST_OVERHEAD_S: what a framework's step costs beyond its kernels (feeding one batch, starting the program,
#   fetching the result), paid once per step.
# - SUSTAINED_CLOCK: where between base and boost clock the GPU runs. A published latency is a steady state
#   (about 1,000 batches back to back), where a GPU holds the clock its power and cooling allow under load: NVIDIA's
#   base clock is the clock guaranteed at the board's TDP. The GPU model's own (0.42) comes from short kernel
#   benchmarks, which run nearer boost; a fit over [0, 1] (base to boost) picked 0, the base clock, and it is now
#   fixed there (left free, the fits with one model held out used it to trade against the launch and host
#   constants: benchmarks/whole_model.py's CLOCKS). It matters most for a low-power GPU (a 70 W T4: base 585 MHz,
#   boost 1,590 MHz).
# - TF32_EFFICIENCY: the share of the datasheet TF32 tensor-core peak that TF32 work reaches. The published stacks
#   (TensorFlow 20.06-21.02: CUDA 11.0-11.2, cuDNN 8.0-8.1, the first for Ampere) ran TF32 below its peak: in the
#   same table on the same A100, BERT-large (384 tokens, batch 8) ran 3.1x faster in TF32 than in FP32 where the
#   peaks say 8x, and U-Net (an A100 80GB) 3.0x slower in TF32 than in FP16 where they say 2x. The reference data the
#   GPU model was fitted on has no TF32 (NeuSight ran with TF32 off), so this is fitted here (0.40, by the capped
#   mean error of benchmarks/whole_model.py; 0.50 while the fit minimised the median, which jumped between optima
#   when the RNN step refit of 2026-11-27 moved the GPU model's shared constants by about 1%; 0.30 before
#   half-precision programs were read as a GPU runs them, when FP16 rows read slow and TF32 made up for it).
TF32_EFFICIENCY = 0.40
KERNEL_S = PROGRAM_KERNEL_S  # 5.29 us: kept in gpu_model, whose compiled RNN loops pay it per kernel too
HOST_OVERHEAD_S = 9.3e-04
SUSTAINED_CLOCK = 0.0
# The whole model's band, as multipliers of the prediction: the 2.5th and 97.5th percentiles of
# log(published / predicted) over the same rows, each model's residuals taken from constants fitted without it
# (benchmarks/whole_model.md). A 95% band, not the 90% of a layer's: published whole-model latencies of one model
# on one GPU differ between NVIDIA's own tables by up to 2.1x (the T4's TensorFlow 1 and 2 tables, 1.7x at the
# median), so a 90% band from the pooled residuals holds 66% on the T4 and 79% on the A100 80GB; the 95% band holds
# 95% of all rows, and 86-99% per GPU (the A100 80GB lowest: its U-Net rows read fast).
WHOLE_BAND = (0.56, 1.47)
BAND_PERCENT = 95
LAYER_BAND_PERCENT = round(TARGET_COVERAGE * 100)  # every other prediction's band
# A train step's whole-model prediction uses the same inference-fitted constants and band; against published
# single-GPU training throughput it reads slow (benchmarks/whole_training.md), and its method says so.
TRAINING_CAVEAT = (" (fitted on inference; train steps checked against published training runs read 1.2x slow "
                   "at the median, FP32 BERT 0.76-0.95x, ResNet-50 in half precision 2.1-2.2x: benchmarks/whole_training.md)")
METHOD = "GPU model of the fused whole-model program"


@dataclass(frozen=True)
class WholePrediction:
    """The whole model's predicted seconds (kernels plus host overhead), and each kernel's seconds."""

    seconds: float
    kernel_seconds: np.ndarray
    kernels: list[dict[str, Any]]
    host_overhead_s: float

    def counts(self) -> dict[str, int]:
        """Kernels launched per kind (a loop's kernels once per trip)."""
        out: dict[str, int] = {}
        for kernel in self.kernels:
            out[kernel["kind"]] = out.get(kernel["kind"], 0) + int(kernel.get("repeat", 1))
        return out


def kernel_work(kernel: dict[str, Any]) -> Work:
    """One kernel of the fused program as the GPU model's work."""
    moved, flops = float(kernel.get("bytes", 0.0)), float(kernel.get("flops", 0.0))
    if kernel.get("kind") == GEMM:
        return Work(GEMM, flops, moved, m=int(kernel["m"]), n=int(kernel["n"]), k=int(kernel["k"]),
                    count=int(kernel.get("count", 1)))
    if kernel.get("kind") == CONV:
        window, stride, channels = (int(kernel.get(c, 1)) for c in ("window", "stride", "channels"))
        return Work(CONV, flops, moved, m=int(kernel["m"]), n=int(kernel["n"]), k=int(kernel["k"]), window=window,
                    stride=stride, winograd=window == 9 and stride == 1, tensor_core_aligned=channels % 8 == 0,
                    phase="backward_weight" if kernel.get("gradient") == "weights" else "forward")
    return Work(MEMORY, flops, moved)


def program_frame(kernels: list[dict[str, Any]], spec: GpuSpec, precision: str,
                  tf32_efficiency: float = TF32_EFFICIENCY) -> pd.DataFrame:
    """The GPU model's table for a program's kernels on ``spec`` at ``precision`` (TF32 tensor-core work at
    ``tf32_efficiency`` of its peak)."""
    works = [kernel_work(k) for k in kernels]
    frame = frame_of(works, [precision] * len(works), [spec] * len(works))
    if len(frame):
        tf32 = (frame["precision"] == "tf32").to_numpy() & frame["tensor_cores"].to_numpy(dtype=bool)
        peak = frame["peak_flops_per_s"]
        frame["peak_flops_per_s"] = np.where(tf32, peak * tf32_efficiency, peak)
    return frame


def program_model(model: GpuModel, kernel_s: float = KERNEL_S, sustained_clock: float = SUSTAINED_CLOCK) -> GpuModel:
    """``model`` as it prices the kernels of a compiled program run in a steady state (the constants above)."""
    return replace(model, launch_s=kernel_s, sustained_clock=sustained_clock)


def parse_kernels(text: Any) -> list[dict[str, Any]] | None:
    """A profile's ``kernels`` cell (JSON) as a list, or None where it is blank or unreadable."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, list) else None


def predict_whole(kernels: list[dict[str, Any]], spec: GpuSpec, precision: str, model: GpuModel,
                  host_overhead_s: float = HOST_OVERHEAD_S, fold_epilogues: bool = True, kernel_s: float = KERNEL_S,
                  sustained_clock: float = SUSTAINED_CLOCK,
                  tf32_efficiency: float = TF32_EFFICIENCY) -> WholePrediction:
    """The program's kernels run one after another on ``spec`` at ``precision``, plus the step's host overhead.

    Each kernel is priced by ``model`` as a kernel of a compiled program: ``kernel_s`` in place of the model's
    launch cost, at ``sustained_clock``, TF32 work at ``tf32_efficiency`` of its peak (see the constants above).

    With ``fold_epilogues``, an elementwise pass that only reads a convolution's or GEMM's output (its bias,
    activation, a scalar scale; not a BatchNorm's per-feature scale) is run as that GEMM's epilogue, as a GPU's
    libraries do (cuDNN's fused convolution-bias-activation, cuBLASLt's epilogues; XLA's GPU backend rewrites to
    them) and a CPU compile does not: it costs nothing more than the GEMM's own write.
    """
    if fold_epilogues:
        kernels = [k for k in kernels if not k.get("epilogue")]
    if not kernels:
        return WholePrediction(host_overhead_s, np.zeros(0), [], host_overhead_s)
    frame = program_frame(kernels, spec, precision, tf32_efficiency)
    repeats = np.array([float(k.get("repeat", 1)) for k in kernels])
    seconds = predict_frame(frame, program_model(model, kernel_s, sustained_clock)) * repeats
    return WholePrediction(float(seconds.sum()) + host_overhead_s, seconds, kernels, host_overhead_s)


def without_layers(kernels: list[dict[str, Any]], layers: Iterable[str], names: list[str]) -> list[dict[str, Any]]:
    """The program's kernels less those of ``layers`` and the unnamed loop kernels among theirs (a loop's counter
    and copies carry no layer's name). A GPU runs a recurrent layer as cuDNN's kernel or its own compiled loop,
    priced as the layer is; the CPU program's loop has kernels every trip that neither has."""
    gone, out, in_loop = set(layers), [], False
    for kernel in kernels:
        owner, looped = layer_of(str(kernel.get("op", "")), names), int(kernel.get("repeat", 1)) > 1
        if owner in gone or (owner is None and looped and in_loop):
            in_loop = looped if owner in gone else in_loop
            continue
        in_loop = False
        out.append(kernel)
    return out


def band_percent(methods: Iterable[Any]) -> str:
    """The band's level for rows predicted by ``methods``: the compiled program's 95%, every other method's 90%."""
    found = {BAND_PERCENT if isinstance(m, str) and m.startswith(METHOD) else LAYER_BAND_PERCENT for m in methods}
    return "/".join(f"{level}%" for level in sorted(found, reverse=True)) or f"{LAYER_BAND_PERCENT}%"


def layer_seconds(prediction: WholePrediction, layers: Iterable[str]) -> dict[str, float]:
    """Each layer's predicted seconds inside the whole model: the kernels its ops became ('' for the rest)."""
    names = list(layers)
    out: dict[str, float] = {}
    for kernel, seconds in zip(prediction.kernels, prediction.kernel_seconds):
        owner = layer_of(str(kernel.get("op", "")), names) or ""
        out[owner] = out.get(owner, 0.0) + float(seconds)
    return out
