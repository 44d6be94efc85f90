"""A GPU's time for a layer from its work and the GPU's datasheet, with constants fitted on published measurements.

For each kernel a layer launches:

    t = launch + max(compute, bytes / (bandwidth x memory_efficiency))

Data that fits in L2 moves at the L2's bandwidth instead, which scales with the chip (SMs x clock x
``l2_bytes_per_clock_per_sm``), not with its DRAM: an L4's 48 MB L2 is many times its 300 GB/s GDDR6,
an A100's 40 MB little more than its HBM2.

``compute`` is a GEMM as a GPU library runs it: the M x N output cut into tiles, the tiles (and
slices of K, split-K) spread over the SMs in waves, each wave running at the SM's share of the
datasheet peak for the precision times an efficiency (per kind: GEMM or convolution; CUDA cores
or tensor cores), smaller tiles running less efficiently (area^tile_exponent). The library's
choice is taken to be the fastest of those shapes. Wave quantization is what a roofline misses:
a 64 x 64 GEMM takes a few tiles of one wave whatever the GPU's peak. A recurrent layer is its
input projection plus ``steps`` sequential step GEMMs, each with a per-step cost (cuDNN's fused
kernel) or three kernel launches (a loop). Memory-bound kinds move their bytes.

The constants are the same for every GPU (a held-out GPU is predicted from its datasheet alone);
they are fitted in log error on the reference measurements (tbs/predictions/reference); the
residuals' percentiles per kind and regime (compute-, memory- or launch-bound) are the 90% band
(tbs/predictions/bands.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from tbs.predictions.bands import band_key, regime_band
from tbs.predictions.work import CONV, LOOP_KERNELS_PER_STEP, MEMORY, PHASE_GEMMS, RECURRENT, Work

# The output tiles a GEMM library picks from (narrow ones for a GEMM with few rows or columns).
TILES = ((128, 128), (128, 64), (128, 32), (64, 128), (64, 64), (64, 32), (32, 64), (32, 32), (256, 16), (16, 256))
# cuDNN's implicit-GEMM convolutions tile the output positions by 128 (or 64) and never split K: a
# convolution with few output positions runs on few SMs, each through the whole K = kernel area x channels.
CONV_TILES = ((128, 128), (128, 64), (128, 32), (64, 64), (64, 32))
SPLITS = (1, 2, 4, 8, 16)  # split-K factors, each slice at least MIN_SPLIT_K deep
MIN_SPLIT_K = 128
REFERENCE_TILE = 128 * 128
# A convolution's weights' gradient bends along the size unlike its forward and input gradient (DeepBench's cuDNN
# backward-filter times: about 1.2x slower than the forward's curve says under 1 GFLOP, about 1.35x faster over
# 5 GFLOP, where the forward and input gradient stay flat), so it takes a curve of its own on top of its kind's.
PHASE_CURVES = {"conv:backward_weight": (CONV, ("backward_weight",))}
TENSOR_CORE_PRECISIONS = ("tf32", "fp16", "bf16", "mixed")
PEAK_OF = {"mixed": "fp16", "bf16": "fp16"}  # fp16 inputs, fp32 accumulation: the half-precision peak
# The reference source whose timing and libraries a tbs prediction is priced as: PyTorch 2.1 / CUDA 12.1, the
# libraries a current framework runs (the other sources' offsets from it are fitted: GpuModel.source_log_scale).
REFERENCE_SOURCE = "neusight"
STEP_REFERENCE_SM_HZ = 80 * 1.53e9  # a V100's SMs x boost clock: where a fused RNN step costs fused_step_s
# What a kernel of a compiled program costs beyond its work: launched back to back by the program, not one by one
# between CUDA events (launch_s). Fitted on published whole-model latencies (tbs.predictions.whole.KERNEL_S).
PROGRAM_KERNEL_S = 5.29e-06
SCALE_ROUNDS = 10  # alternating medians for the architecture and source offsets
# A reference row's harness, not its kernel: the framework's call floor and what sizes it (never in a tbs prediction).
HARNESS_COLUMNS = ("framework_overhead", "call", "calls_before")


def sustained_fraction(base_hz: Any, boost_hz: Any, sustained: float) -> Any:
    """The share of the boost clock a GPU sustains: ``sustained`` of the way from base to boost (numbers or arrays)."""
    return (base_hz + sustained * (boost_hz - base_hz)) / boost_hz


@dataclass(frozen=True)
class GpuSpec:
    """What the model knows of a GPU: its datasheet."""

    id: str
    sm_count: int
    peaks_flops_per_s: Mapping[str, float]  # fp32 / tf32 / fp16 dense peaks (at the boost clock)
    memory_bandwidth_bytes_per_s: float
    base_clock_hz: float | None = None  # a low-power GPU sustains far less than its boost clock under load
    boost_clock_hz: float | None = None
    l2_bytes: float | None = None  # data that fits is re-read from L2, faster than DRAM
    architecture: str = ""  # e.g. ampere: reference GPUs of the same architecture share a correction

    def clock_factor(self, sustained: float) -> float:
        """The fraction of the boost clock sustained: base + ``sustained`` x (boost - base), over boost."""
        if not (self.base_clock_hz and self.boost_clock_hz):
            return 1.0
        return float(sustained_fraction(self.base_clock_hz, self.boost_clock_hz, sustained))

    def peak(self, precision: str) -> float | None:
        return self.peaks_flops_per_s.get(precision)


@dataclass
class GpuModel:
    """The fitted constants, shared by every GPU, and each kind's residual band (log, 5th and 95th percentiles)."""

    gemm_efficiency_cuda_cores: float = 0.7
    gemm_efficiency_tensor_cores: float = 0.6
    conv_efficiency_cuda_cores: float = 0.6
    conv_efficiency_tensor_cores: float = 0.5
    tile_exponent: float = 0.3
    launch_s: float = 5e-6
    memory_efficiency: float = 0.8
    fused_step_s: float = 2e-6  # a fused (cuDNN) RNN step's own cost, on a GPU of STEP_REFERENCE_SM_HZ
    # ... which falls with the GPU's SMs x clock to this power: DeepBench's 256-unit LSTMs take 60-85 us a step on
    # Maxwell, 15-60 on Pascal, 27-33 on a V100, and tbs's own H200 measured 16-27 us for 32-128 units.
    step_exponent: float = 0.5
    sustained_clock: float = 0.6  # where between base and boost clock a GPU runs long GEMMs
    # Data that fits in L2 moves at this many bytes per SM per boost-clock cycle (never slower than DRAM).
    l2_bytes_per_clock_per_sm: float = 16.0
    winograd_gain: float = 2.0  # how much faster a 3x3 stride-1 convolution runs than its direct FLOPs say
    # Winograd's GEMMs reduce over the channels alone (the implicit GEMM over 3 x 3 x channels): a tile's fixed work
    # (transforming its inputs, transforming and storing its outputs) costs as much as this many more channels, so
    # with few channels the implicit GEMM is faster, and cuDNN's autotuner (PyTorch's cudnn.benchmark, TensorFlow's
    # and XLA's autotuning) runs it instead (NeuSight: Winograd on 0-37% of convolutions with < 32 input channels per
    # GPU, none of those with < 8; 70-92% of those with >= 128).
    winograd_channels: float = 32.0
    # A convolution's gradients run other kernels than its forward (the weights': a reduction over every position):
    # their rates as multiples of the forward's.
    conv_grad_data_gain: float = 1.0
    conv_grad_weight_gain: float = 1.0
    # A framework's own cost per op where the reference timed framework calls (PyTorch), not kernels; never
    # added to a prediction (tbs times compiled programs: the kernels).
    framework_overhead_s: float = 1e-5
    conv_framework_overhead_s: float = 3e-5  # a framework's convolution call costs more (cuDNN plan look-up)
    # ... and more with every other shape its process ran before (the reference's ``calls_before``): NeuSight's small
    # convolutions took 60-140 us in the first tenth of a GPU's run of ~5,000 shapes (random order) and 340-850 us in
    # the last, whatever their size (PyTorch 2.1's cuDNN v8 path: its per-shape look-ups slow as they accumulate).
    conv_call_growth_s: float = 5e-8
    # NeuSight's micro-benchmarks called nn.LayerNorm and nn.Softmax modules, whose calls cost more host time than
    # a torch function's (the ``call`` column of the reference table); never added to a prediction either.
    layernorm_call_overhead_s: float = 4e-5
    softmax_call_overhead_s: float = 3e-5
    # Per architecture, the median log error left after the shared constants, for compute kinds and for
    # memory-bound ones: what the datasheet does not show (e.g. Maxwell's GEMMs reach less of their peak).
    architecture_log_scale: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per reference source other than REFERENCE_SOURCE, the same for how it was timed and with which libraries
    # (DeepBench: CUDA 7.5-10.1 cuBLAS/cuDNN called back to back): fitted beside the architectures', never applied
    # to a tbs prediction (a frame without a ``source`` column is priced as REFERENCE_SOURCE's libraries run).
    source_log_scale: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per kind, the median log error left along the size of the work (log10 FLOPs per SM; bytes for
    # memory-bound kinds) as (x, y) knots: the efficiency curve the constants alone do not bend to.
    size_curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    bands: dict[str, tuple[float, float]] = field(default_factory=dict)  # per kind, whatever its regime
    # Per kind, the band per regime bucket: {"edges": regime cut points, "bands": [(low, high)], "tail": level}.
    regime_bands: dict[str, dict[str, Any]] = field(default_factory=dict)
    fitted_on: dict[str, int] = field(default_factory=dict)  # rows per kind the constants were fitted on

    def constants(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("bands", "regime_bands", "fitted_on", "architecture_log_scale", "source_log_scale",
                                  "size_curves")}

    def as_dict(self) -> dict:
        return asdict(self)


def frame_of(works: Iterable[Work], precisions: Iterable[str], specs: Iterable[GpuSpec]) -> pd.DataFrame:
    """Works on GPUs as the table the model computes on (one row per work, its GPU's datasheet beside it)."""
    rows = []
    for work, precision, spec in zip(works, precisions, specs):
        in_m, in_n, in_k = work.input_gemm or (0, 0, 0)
        tensor_cores = precision in TENSOR_CORE_PRECISIONS and work.tensor_core_aligned
        rate = PEAK_OF.get(precision, precision) if tensor_cores or precision not in TENSOR_CORE_PRECISIONS else "fp32"
        peak = spec.peak(rate) or spec.peak("fp32") or float("nan")
        rows.append({**{f.name: getattr(work, f.name) for f in fields(work) if f.name != "input_gemm"},
                     "in_m": in_m, "in_n": in_n, "in_k": in_k, "precision": precision,
                     "tensor_cores": tensor_cores, "sm_count": spec.sm_count,
                     "peak_flops_per_s": peak, "bandwidth_bytes_per_s": spec.memory_bandwidth_bytes_per_s,
                     "base_clock_hz": spec.base_clock_hz or np.nan, "boost_clock_hz": spec.boost_clock_hz or np.nan,
                     "l2_bytes": spec.l2_bytes or np.nan, "architecture": spec.architecture})
    return pd.DataFrame(rows)


def _options() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tiles = [(tm, tn, split) for tm, tn in TILES for split in SPLITS]
    return tuple(np.array([t[i] for t in tiles], dtype=float) for i in range(3)) + (  # type: ignore[return-value]
        np.array([tm * tn / REFERENCE_TILE for tm, tn, _ in tiles]),)


TILE_M, TILE_N, SPLIT, TILE_AREA = _options()
CONV_OPTION = np.array([(tm, tn) in CONV_TILES for tm, tn in zip(TILE_M, TILE_N)])


def gemm_slots(m: np.ndarray, n: np.ndarray, k: np.ndarray, count: np.ndarray, sm_count: np.ndarray) -> np.ndarray:
    """Per GEMM and tiling (tile x split-K): the FLOPs one SM runs, waves x one tile's FLOPs (inf: not allowed)."""
    m, n, k, count, sm_count = (np.asarray(v, dtype=float)[:, None] for v in (m, n, k, count, sm_count))
    tiles = np.ceil(m / TILE_M) * np.ceil(n / TILE_N) * count
    depth = np.ceil(k / SPLIT)
    waves = np.ceil(tiles * SPLIT / sm_count)
    slots = waves * 2.0 * TILE_M * TILE_N * depth
    return np.where((SPLIT == 1) | (depth >= MIN_SPLIT_K), slots, np.inf)


def gemm_seconds(slots: np.ndarray, sm_flops_per_s: np.ndarray, tile_exponent: float) -> np.ndarray:
    """The fastest tiling of each GEMM: smaller tiles run at area^tile_exponent of a 128 x 128 tile's rate."""
    return (slots / TILE_AREA ** tile_exponent).min(axis=1) / sm_flops_per_s


def gemm_shapes(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Every GEMM each row may run, as tilings (they do not depend on the constants: a fit computes them once)."""
    m, n, k, count, sms = (frame[c].to_numpy(dtype=float) for c in ("m", "n", "k", "count", "sm_count"))
    steps = frame["steps"].to_numpy(dtype=float)
    in_m, in_n, in_k = (np.maximum(frame[c].to_numpy(dtype=float), 1.0) for c in ("in_m", "in_n", "in_k"))
    ones = np.ones_like(m)
    conv = (frame["kind"].to_numpy() == CONV)[:, None]
    unsplit = np.where(conv & ~(CONV_OPTION & (SPLIT == 1)), np.inf, 1.0)  # conv: its tiles, no split-K
    conv_tiles = np.where(conv & ~CONV_OPTION, np.inf, 1.0)  # the weights' gradient reduces over positions: split
    window, stride = (np.maximum(frame[c].to_numpy(dtype=float), 1.0) if c in frame else ones for c in ("window", "stride"))
    # The input's gradient: every input position (stride^2 x the output's) x input channels, over window x filters.
    grad_x = gemm_slots(m * stride ** 2, np.maximum(k / window, 1.0), window * n, count, sms)
    shapes = {"forward": gemm_slots(m, n, k, count, sms) * unsplit, "grad_x": grad_x * unsplit,
              "grad_w": gemm_slots(k, n, m, count, sms) * conv_tiles, "projection": gemm_slots(in_m, in_n, in_k, ones, sms),
              "projection_grad_x": gemm_slots(in_m, in_k, in_n, ones, sms),
              "projection_grad_w": gemm_slots(in_k, in_n, in_m, ones, sms),
              "steps_grad_w": gemm_slots(k, n, m * steps, ones, sms)}
    return shapes


def predict_frame(frame: pd.DataFrame, model: GpuModel, shapes: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Seconds for every row of ``frame_of``'s table (``shapes``: its ``gemm_shapes``, when already known)."""
    kind = frame["kind"].to_numpy()
    tensor = frame["tensor_cores"].to_numpy(dtype=bool)
    conv = kind == CONV
    # A 1x1 stride-1 convolution is a plain GEMM of the activations (no gathering of windows): a GEMM's rate.
    pointwise = (frame["window"].to_numpy() == 1) & (frame["stride"].to_numpy() == 1) if "window" in frame else False
    efficiency = np.where(conv & ~pointwise,
                          np.where(tensor, model.conv_efficiency_tensor_cores, model.conv_efficiency_cuda_cores),
                          np.where(tensor, model.gemm_efficiency_tensor_cores, model.gemm_efficiency_cuda_cores))
    sms = frame["sm_count"].to_numpy(dtype=float)
    base, boost = frame["base_clock_hz"].to_numpy(dtype=float), frame["boost_clock_hz"].to_numpy(dtype=float)
    clock = np.nan_to_num(sustained_fraction(base, boost, model.sustained_clock), nan=1.0)  # unknown clocks: 1
    sm_rate = frame["peak_flops_per_s"].to_numpy(dtype=float) / sms * efficiency * clock
    shapes = shapes if shapes is not None else gemm_shapes(frame)
    seconds = {name: gemm_seconds(slots, sm_rate, model.tile_exponent) for name, slots in shapes.items()}
    # cuDNN's Winograd kernels run on the CUDA cores: a convolution on tensor cores (half precision, TF32) is an
    # implicit GEMM (DeepBench's fp16 3x3 convolutions on a V100/T4 ran 1.3-1.7x slower than a Winograd gain said).
    winograd = frame["winograd"].to_numpy(dtype=bool) & conv & ~tensor if "winograd" in frame \
        else np.zeros(len(frame), bool)
    fast = np.where(winograd, model.winograd_gain, 1.0)
    window = np.maximum(frame["window"].to_numpy(dtype=float), 1.0) if "window" in frame else np.ones(len(frame))
    # The forward reduces over the input channels (K / window), the input's gradient over the output channels (N).
    forward = _fastest_algorithm(seconds["forward"], winograd, frame["k"].to_numpy(dtype=float) / window, model)
    grad_x = _fastest_algorithm(seconds["grad_x"], winograd, frame["n"].to_numpy(dtype=float), model) \
        / np.where(conv, model.conv_grad_data_gain, 1.0)
    grad_w = seconds["grad_w"] / (fast * np.where(conv, model.conv_grad_weight_gain, 1.0))
    gemms = frame["phase"].map(PHASE_GEMMS).fillna(1).to_numpy(dtype=float)
    phase = frame["phase"].to_numpy()
    compute = np.select([phase == "backward_data", phase == "backward_weight", phase == "backward",
                         phase == "training"], [grad_x, grad_w, grad_x + grad_w, forward + grad_x + grad_w], forward)
    moved = frame["bytes"].to_numpy(dtype=float)
    memory = moved / _bandwidth(frame, moved, model)
    launches = gemms * model.launch_s
    matmul = launches + np.maximum(compute, memory)
    weight_bytes = frame["n"].to_numpy(dtype=float) * frame["k"].to_numpy(dtype=float) * np.where(
        frame["precision"].isin(["fp16", "mixed", "bf16"]).to_numpy(), 2.0, 4.0)  # read again every step
    step_memory = weight_bytes / _bandwidth(frame, weight_bytes, model)
    for name in ("forward", "grad_x"):
        seconds["step_" + name] = np.maximum(seconds[name] / fast, step_memory)
    recurrent = np.maximum(_recurrent_seconds(frame, phase, seconds, model), launches + memory)
    calls_before = frame["calls_before"].to_numpy(dtype=float) if "calls_before" in frame else 0.0
    conv_call = model.conv_framework_overhead_s + model.conv_call_growth_s * calls_before
    overhead = np.where(frame["framework_overhead"].to_numpy(dtype=bool),
                        np.where(conv, conv_call, model.framework_overhead_s), 0.0) \
        if "framework_overhead" in frame else np.zeros(len(frame))
    if "call" in frame:
        call = frame["call"].to_numpy()
        overhead = np.select([call == "layernorm", call == "softmax"],
                             [model.layernorm_call_overhead_s, model.softmax_call_overhead_s], overhead)
    kernels = np.select([kind == MEMORY, kind == RECURRENT], [model.launch_s + memory, recurrent], matmul)
    # The corrections (per architecture, source and size) are the kernels': a harness's call floor is host time.
    kernels = kernels * np.exp(_offset_log_scale(frame, model) + _size_correction(frame, model))
    # A framework call between two CUDA events: the kernel runs while the host finishes the call, so a memory-bound
    # op takes the longer of the two (NeuSight's elementwise/LayerNorm/softmax times stay at the call's floor until
    # bytes / bandwidth passes it, then follow bandwidth with nothing added). Convolutions and GEMMs pay their
    # overhead before the kernel starts (cuDNN's plan look-up, cuBLAS's heuristics): added.
    return np.where(kind == MEMORY, np.maximum(overhead, kernels), overhead + kernels)


def _fastest_algorithm(direct: np.ndarray, winograd: np.ndarray, channels: np.ndarray, model: GpuModel) -> np.ndarray:
    """The faster of the implicit GEMM (``direct``) and, where eligible, Winograd, as cuDNN's autotuner picks.

    Winograd does ``winograd_gain`` x fewer multiplies, but its GEMMs reduce over ``channels`` alone, and each tile's
    transforms cost as much as ``winograd_channels`` more: its time is direct / gain x (1 + winograd_channels /
    channels), slower than the implicit GEMM for few channels (a first layer's 3 colours).
    """
    transformed = direct / model.winograd_gain * (1.0 + model.winograd_channels / np.maximum(channels, 1.0))
    return np.where(winograd, np.minimum(direct, transformed), direct)


def _bandwidth(frame: pd.DataFrame, moved: np.ndarray, model: GpuModel) -> np.ndarray:
    """Bytes per second for moving ``moved`` bytes: DRAM's x memory_efficiency, or the L2's where they fit in it.

    The L2's bandwidth is the SMs' (SMs x boost clock x l2_bytes_per_clock_per_sm), never below DRAM's; a GPU
    without a known clock or L2 size moves everything at DRAM's rate.
    """
    dram = frame["bandwidth_bytes_per_s"].to_numpy(dtype=float) * model.memory_efficiency
    in_l2 = moved <= np.nan_to_num(frame["l2_bytes"].to_numpy(dtype=float), nan=0.0)
    clock = np.nan_to_num(frame["boost_clock_hz"].to_numpy(dtype=float), nan=0.0)
    l2 = np.maximum(model.l2_bytes_per_clock_per_sm * frame["sm_count"].to_numpy(dtype=float) * clock, dram)
    return np.where(in_l2, l2, dram)


def size_on_curve(frame: pd.DataFrame) -> np.ndarray:
    """Where a row sits on its kind's efficiency curve: log10 FLOPs per SM, or log10 bytes when memory-bound."""
    kind = frame["kind"].to_numpy()
    flops_per_sm = frame["flops"].to_numpy(dtype=float) / frame["sm_count"].to_numpy(dtype=float)
    return np.log10(np.maximum(np.where(kind == MEMORY, frame["bytes"].to_numpy(dtype=float), flops_per_sm), 1.0))


def phase_curve_key(kind: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Which rows take a phase's own size curve on top of their kind's (``PHASE_CURVES``), by key; '' for none."""
    out = np.full(len(kind), "", dtype=object)
    for key, (name, phases) in PHASE_CURVES.items():
        out[(kind == name) & np.isin(phase, phases)] = key
    return out


def _size_correction(frame: pd.DataFrame, model: GpuModel) -> np.ndarray:
    out = np.zeros(len(frame))
    if not model.size_curves:
        return out
    kind, size = frame["kind"].to_numpy(), size_on_curve(frame)
    phased = phase_curve_key(kind, frame["phase"].to_numpy()) if "phase" in frame else np.full(len(kind), "")
    for name, (xs, ys) in model.size_curves.items():
        chosen = (kind == name) | (phased == name)  # a phase's curve adds to its kind's
        out[chosen] += np.interp(size[chosen], xs, ys)
    return out


def offset_group(kind: np.ndarray) -> np.ndarray:
    """Kinds that share an architecture's offset. RNNs share the compute kinds' (an offset of their own, tried,
    moved the shared constants enough to move the whole-model fit: benchmarks/whole_model.md, docs/results.md)."""
    return np.where(kind == MEMORY, "memory", "compute")


def _offset_log_scale(frame: pd.DataFrame, model: GpuModel) -> np.ndarray:
    """Each row's architecture offset, plus its source's where the frame says which source timed it."""
    groups = offset_group(frame["kind"].to_numpy())
    out = np.zeros(len(frame))
    for column, scales in (("architecture", model.architecture_log_scale), ("source", model.source_log_scale)):
        if scales and column in frame:
            out += np.array([scales.get(str(v), {}).get(g, 0.0) for v, g in zip(frame[column], groups)])
    return out


def _recurrent_seconds(frame: pd.DataFrame, phase: np.ndarray, seconds: dict[str, np.ndarray],
                       model: GpuModel) -> np.ndarray:
    """An RNN: the inputs' projection at once, then ``steps`` sequential step GEMMs (forward, or dX backward),
    each at least the time to read the recurrent weights again; the weights' gradient is one GEMM over every step."""
    steps = frame["steps"].to_numpy(dtype=float)
    sm_hz = frame["sm_count"].to_numpy(dtype=float) * frame["boost_clock_hz"].to_numpy(dtype=float)
    sm_hz = np.where(np.isfinite(sm_hz) & (sm_hz > 0), sm_hz, STEP_REFERENCE_SM_HZ)  # no clock: the reference's
    fused_step = model.fused_step_s * (sm_hz / STEP_REFERENCE_SM_HZ) ** -model.step_exponent
    in_program = frame["in_program"].to_numpy(dtype=bool) if "in_program" in frame else np.zeros(len(frame), bool)
    # a compiled loop's kernels at a program's launch interval (never above the model's: a whole program priced
    # with its own, smaller, launch cost keeps it)
    launch = np.where(in_program, np.minimum(PROGRAM_KERNEL_S, model.launch_s), model.launch_s)
    loop_step = LOOP_KERNELS_PER_STEP * launch
    per_step = np.where(frame["fused"].to_numpy(dtype=bool), fused_step, loop_step)
    projected = frame["in_m"].to_numpy(dtype=float) > 0  # else the inputs' projection was not timed
    forward = model.launch_s + projected * seconds["projection"] + steps * (per_step + seconds["step_forward"])
    grad_data = model.launch_s + projected * seconds["projection_grad_x"] + steps * (per_step + seconds["step_grad_x"])
    grad_weight = model.launch_s + seconds["steps_grad_w"] + projected * seconds["projection_grad_w"]
    return np.select([phase == "backward_data", phase == "backward_weight", phase == "backward", phase == "training"],
                     [grad_data, grad_weight, grad_data + grad_weight, forward + grad_data + grad_weight], forward)


def band_factors(model: GpuModel, kind: str, at: float | None = None,
                 phase: str = "forward") -> tuple[float, float] | None:
    """(low, high) multipliers of a prediction for ``kind`` in ``phase``: its residuals' percentiles in the regime
    ``at`` (``bands.regime`` of the row), or over the whole kind where ``at`` or the regime bands are missing."""
    band = regime_band(model.regime_bands, band_key(kind, phase), at) if at is not None else None
    band = band or model.bands.get(kind)
    return None if band is None else (math.exp(band[0]), math.exp(band[1]))
