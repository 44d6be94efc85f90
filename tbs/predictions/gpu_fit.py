"""Fitting the GPU model's shared constants on reference measurements (tbs/predictions/reference).

The constants are fitted in log error (scipy's least squares, soft L1), each kind of reference row
pinning down only the constants it can (``_FITTED_BY``), within physical bounds (``_BOUNDS``); then
each kind's size curve, the per-architecture and per-source offsets, and the 90% bands come from the
residuals that are left.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tbs.predictions.bands import fit_bands, regime
from tbs.predictions.gpu_model import (HARNESS_COLUMNS, PHASE_CURVES, REFERENCE_SOURCE, SCALE_ROUNDS, GpuModel,
                                       gemm_shapes, offset_group, phase_curve_key, predict_frame, size_on_curve)
from tbs.predictions.work import CONV, GEMM, MEMORY, RECURRENT

# Which constants each kind of reference row can pin down (the others keep their prior values).
_FITTED_BY = {
    (GEMM, False): ("gemm_efficiency_cuda_cores", "tile_exponent", "launch_s", "sustained_clock"),
    (GEMM, True): ("gemm_efficiency_tensor_cores", "tile_exponent", "launch_s"),
    (CONV, False): ("conv_efficiency_cuda_cores", "winograd_gain", "winograd_channels", "conv_framework_overhead_s",
                    "conv_call_growth_s", "conv_grad_data_gain", "conv_grad_weight_gain"),
    (CONV, True): ("conv_efficiency_tensor_cores",),
    (MEMORY, False): ("memory_efficiency", "launch_s", "l2_bytes_per_clock_per_sm", "framework_overhead_s",
                      "layernorm_call_overhead_s", "softmax_call_overhead_s"),
    (RECURRENT, False): ("fused_step_s", "step_exponent"),
    (RECURRENT, True): ("fused_step_s", "step_exponent"),
}
MIN_PHASE_CURVE_ROWS = 200  # a phase's own size curve only where the reference has this many of its rows
_BOUNDS = {"tile_exponent": (1e-3, 1.5), "launch_s": (5e-7, 5e-5), "fused_step_s": (1e-7, 1e-4),
           "step_exponent": (1e-3, 2.0), "sustained_clock": (1e-3, 1.0), "l2_bytes_per_clock_per_sm": (1.0, 512.0),
           "framework_overhead_s": (1e-7, 1e-4), "layernorm_call_overhead_s": (1e-7, 1e-4),
           "softmax_call_overhead_s": (1e-7, 1e-4),
           "conv_framework_overhead_s": (1e-7, 2e-4), "conv_call_growth_s": (1e-11, 1e-6),
           "winograd_gain": (1.0, 4.0), "winograd_channels": (0.1, 1000.0), "conv_grad_data_gain": (0.2, 5.0),
           "conv_grad_weight_gain": (0.2, 5.0)}


def fit(frame: pd.DataFrame, measured_s: np.ndarray, prior: GpuModel | None = None) -> GpuModel:
    """Constants minimising the squared log error on reference rows; each kind's 90% bands from its residuals."""
    from scipy.optimize import least_squares

    model = prior or GpuModel()
    present = {(kind, bool(tc) and kind != MEMORY) for kind, tc in zip(frame["kind"], frame["tensor_cores"])}
    names = sorted({name for key in present for name in _FITTED_BY.get(key, ())})
    if not names:
        raise ValueError("no reference rows to fit on")
    lower = np.log([_BOUNDS.get(n, (1e-3, 1.0))[0] for n in names])
    upper = np.log([_BOUNDS.get(n, (1e-3, 1.0))[1] for n in names])
    start = np.clip(np.log([getattr(model, n) for n in names]), lower + 1e-9, upper - 1e-9)
    target = np.log(measured_s)

    shapes = gemm_shapes(frame)

    def residuals(logs: np.ndarray) -> np.ndarray:
        trial = GpuModel(**{**model.constants(), **dict(zip(names, np.exp(logs)))})
        return np.log(predict_frame(frame, trial, shapes)) - target

    solution = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.3, diff_step=1e-3)
    fitted = GpuModel(**{**model.constants(), **dict(zip(names, map(float, np.exp(solution.x))))})
    predicted = predict_frame(frame, fitted, shapes)
    errors = target - np.log(predicted)
    sizes, decides = size_on_curve(frame), _kernel_decides(frame, fitted, shapes, predicted)
    for kind in sorted(set(frame["kind"])):
        chosen = (frame["kind"] == kind).to_numpy()
        chosen = chosen & decides if (chosen & decides).any() else chosen
        fitted.size_curves[kind] = _curve(sizes[chosen], errors[chosen])
    errors = target - np.log(predict_frame(frame, fitted, shapes))
    phased = phase_curve_key(frame["kind"].to_numpy(), frame["phase"].to_numpy())
    for key in PHASE_CURVES:  # what a phase's rows leave after their kind's curve
        chosen = (phased == key) & decides
        if chosen.sum() >= MIN_PHASE_CURVE_ROWS:
            fitted.size_curves[key] = _curve(sizes[chosen], errors[chosen])
    errors = target - np.log(predict_frame(frame, fitted, shapes))
    if "architecture" in frame:
        fitted.architecture_log_scale, fitted.source_log_scale = _offsets(frame[decides], errors[decides])
        errors = target - np.log(predict_frame(frame, fitted, shapes))
    kinds = frame["kind"].to_numpy()
    devices = frame["device"].to_numpy() if "device" in frame else None
    fitted.bands, fitted.regime_bands = fit_bands(kinds, errors, regime(frame, fitted.launch_s), devices,
                                                  frame["phase"].to_numpy())
    fitted.fitted_on = {str(kind): int((kinds == kind).sum()) for kind in sorted(set(kinds))}
    return fitted


def _kernel_decides(frame: pd.DataFrame, model: GpuModel, shapes: dict[str, np.ndarray],
                    predicted: np.ndarray) -> np.ndarray:
    """Rows whose time their kernel sets: not a memory-bound call that waited out its harness's call floor
    (max(floor, kernel)), whose residual says nothing of the kernel a user's prediction is. Only these shape
    the size curves and the architecture and source offsets; the bands keep every row. ``predicted``: the
    rows' predictions with their harness."""
    kernel = predict_frame(frame.drop(columns=[c for c in HARNESS_COLUMNS if c in frame]), model, shapes)
    floor_bound = (frame["kind"].to_numpy() == MEMORY) & (predicted > kernel * (1 + 1e-9))
    return ~floor_bound


def _curve(size: np.ndarray, errors: np.ndarray, per_bin: int = 40) -> tuple[list[float], list[float]]:
    """Median error in bins of equal count along the size (at least ``per_bin`` rows a bin)."""
    order = np.argsort(size)
    bins = max(1, min(12, len(order) // per_bin))
    xs, ys = [], []
    for part in np.array_split(order, bins):
        xs.append(float(np.median(size[part])))
        ys.append(float(np.median(errors[part])))
    return xs, ys


def _offsets(frame: pd.DataFrame, errors: np.ndarray) -> tuple[dict, dict]:
    """Per architecture and per source (REFERENCE_SOURCE: 0), the median log error each leaves, fitted together by
    alternating medians: a GPU measured by two sources (T4, P100) tells their libraries apart from its architecture."""
    table = pd.DataFrame({"architecture": frame["architecture"].astype(str).to_numpy(), "error": errors,
                          "group": offset_group(frame["kind"].to_numpy()),
                          "source": frame["source"].astype(str).to_numpy() if "source" in frame else REFERENCE_SOURCE})
    table["by_source"] = 0.0
    for _ in range(SCALE_ROUNDS):
        table["by_architecture"] = (table["error"] - table["by_source"]).groupby(
            [table["architecture"], table["group"]]).transform("median").where(table["architecture"] != "", 0.0)
        left = table["error"] - table["by_architecture"]
        table["by_source"] = left.groupby([table["source"], table["group"]]).transform("median").where(
            table["source"] != REFERENCE_SOURCE, 0.0)
    nested = {}
    for column in ("architecture", "source"):
        part = table[(table[column] != "") & (table[column] != REFERENCE_SOURCE)]
        values = part.groupby([column, "group"])["by_" + column].first()
        nested[column] = {}
        for (name, group), value in values.items():
            nested[column].setdefault(str(name), {})[str(group)] = float(value)
    return nested["architecture"], nested["source"]
