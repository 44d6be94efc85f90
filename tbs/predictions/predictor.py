"""Predicted cells for devices tbs did not measure: each measured time scaled by a roofline model.

For a layer measured on device S (time t_S, and the compiler's FLOPs F and bytes B), the
prediction for catalog device T is

    t_T = max(c + k x roofline_T, floor_T),   roofline_X = max(F / P_X, B / W_X)

where c (a fixed overhead) and k (seconds per roofline second: 1 / efficiency) are fitted per
layer, non-negative, on its measured batch sizes on S (c counts only on a target of S's kind).
With one batch size there is nothing to fit: t_T = t_S x roofline_T / roofline_S (for a layer
whose time neither FLOPs nor bytes explain on S -- overhead-bound -- and a target of the same
kind, t_T = t_S - roofline_S + roofline_T: the overhead stays, only the work scales). P and W are achievable FLOP/s and bandwidth: S's calibrated on S itself, T's its
datasheet peaks times the fraction of its peak a device reaches (fitted where a measured
device is also in the catalog, else the stated defaults). The layer keeps the efficiency it
showed on S (Habitat's wave scaling, Paleo's per-layer roofline). ``floor_T`` is the launch
cost of one program on an accelerator, which no roofline shows. The 90% band is log-normal:
its width is the spread of the same scaling between the batch sizes measured on S, widened
for a different device kind. Every row says ``source=predicted``, its method and its origin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from tbs.predictions.catalog import CatalogDevice
from tbs.predictions.gpu_predict import gpu_rows, not_predicted
from tbs.profiles.profile import Profile
from tbs.profiles.roofline import bound_of, ceilings
from tbs.columns import PREDICTED
from tbs.schema import MODEL_LAYER, USABLE

METHOD = "roofline scaling"
# The fraction of a datasheet peak compiled programs reach (cuBLAS GEMMs ~70% of dense peak,
# STREAM-like copies ~85% of HBM bandwidth); replaced by the fitted fraction where a measured
# device is in the catalog too.
DEFAULT_ACHIEVABLE = {"flops": 0.7, "bandwidth": 0.85}
LAUNCH_FLOOR_S = {"gpu": 5e-6, "tpu": 5e-6, "cpu": 0.0}  # one compiled program's launch, per layer
SAME_KIND_SIGMA = math.log(1.25)  # extra log-spread for another device of the same kind
CROSS_KIND_SIGMA = math.log(2.0)  # ... and for another kind (CPU -> GPU/TPU): no measurement backs it here
Z90 = 1.645
MATMUL_CATEGORIES = ("dense", "conv", "rnn", "attention")


@dataclass
class Ceilings:
    flops_per_s: float  # matmul work
    vector_flops_per_s: float  # everything else
    bytes_per_s: float

    def roofline_s(self, flops: float, moved: float, matmul: bool) -> tuple[float, float]:
        return flops / (self.flops_per_s if matmul else self.vector_flops_per_s), moved / self.bytes_per_s


def target_ceilings(device: CatalogDevice, achievable: Mapping[str, float], dtype: str) -> Ceilings | None:
    """A catalog device's achievable ceilings (None when the catalog lacks a peak or its bandwidth)."""
    matmul, vector, bandwidth = device.matmul_peak(dtype), device.vector_peak(), device.memory_bandwidth_bytes_per_s
    if not (matmul and vector and bandwidth):
        return None
    return Ceilings(matmul * achievable["flops"], vector * achievable["flops"], bandwidth * achievable["bandwidth"])


def source_ceilings(calibration: Mapping[str, Any] | None, dtype: str) -> Ceilings | None:
    flops, bandwidth = ceilings(calibration, dtype)
    return Ceilings(flops, flops, bandwidth) if flops and bandwidth else None


def scale_seconds(measured_s: float, work_from: tuple[float, float], work_to: tuple[float, float],
                  src: Ceilings, dst: Ceilings, matmul: bool, same_kind: bool) -> float:
    """A measured time scaled from (FLOPs, bytes) on ``src`` to (FLOPs, bytes) on ``dst``.

    Multiplicative (the cell keeps its efficiency against the roofline) unless the time is
    overhead-bound and the target is the same kind of device: then the overhead stays and
    only the roofline part changes.
    """
    source_compute, source_memory = src.roofline_s(*work_from, matmul)
    source_s = max(source_compute, source_memory)
    target_s = max(dst.roofline_s(*work_to, matmul))
    if source_s <= 0:
        return measured_s
    if same_kind and bound_of(source_compute, source_memory, measured_s) == "overhead":
        return measured_s - source_s + target_s
    return measured_s * target_s / source_s


@dataclass
class LayerFit:
    """t = overhead_s + per_roofline x roofline_s, fitted on one layer's measured batch sizes."""

    overhead_s: float  # what the layer costs whatever its work (dispatch, latency)
    per_roofline: float  # measured seconds per roofline second of work (1 / efficiency)


def fit_layer(points: list[tuple[float, float]]) -> LayerFit | None:
    """A non-negative fit of t = c + k*r to (roofline_s, measured_s) points, in relative error.

    Needs two roofline times apart; None otherwise (one batch size: the single-point rules apply).
    """
    from scipy.optimize import nnls

    usable = [(r, t) for r, t in points if r > 0 and t > 0]
    rooflines = [r for r, _ in usable]
    if len(usable) < 2 or max(rooflines) < 1.01 * min(rooflines):
        return None
    scale = max(rooflines)
    matrix = np.array([[1.0 / t, r / scale / t] for r, t in usable])  # rows weighted by 1/t: relative error
    (overhead, k_scaled), _ = nnls(matrix, np.ones(len(usable)))
    return LayerFit(float(overhead), float(k_scaled / scale))


def fits_by_layer(rows: pd.DataFrame, src: Ceilings, whole_model: bool = False) -> dict[str, LayerFit | None]:
    """Each layer's fit over its measured batch sizes on the source device."""
    fits = {}
    for layer, group in rows.dropna(subset=["flops", "bytes_accessed", "median_s"]).groupby("layer"):
        matmul = whole_model or group["category"].iloc[0] in MATMUL_CATEGORIES
        points = [(max(src.roofline_s(f, b, matmul)), t)
                  for f, b, t in zip(group["flops"], group["bytes_accessed"], group["median_s"])]
        fits[str(layer)] = fit_layer(points)
    return fits


def scaling_spread(rows: pd.DataFrame, source: Ceilings) -> float | None:
    """Log-spread of predicting one measured batch size of a layer from another on the same device."""
    errors = []
    for _, group in rows.groupby("layer"):
        group = group.sort_values("batch_size")
        values = list(zip(group["median_s"], group["flops"], group["bytes_accessed"], group["category"]))
        for (t0, f0, b0, c0), (t1, f1, b1, _) in zip(values, values[1:]):
            predicted = scale_seconds(t0, (f0, b0), (f1, b1), source, source, c0 in MATMUL_CATEGORIES, True)
            if predicted > 0 and t1 > 0:
                errors.append(math.log(predicted / t1))
    return float(np.std(errors)) if len(errors) >= 3 else None


def _usable(frame: pd.DataFrame, device: str) -> pd.DataFrame:
    rows = frame[(frame["device"] == device) & frame["status"].isin(USABLE)].copy()
    for column in ("median_s", "flops", "bytes_accessed"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce")
    return rows


def predict_rows(profile: Profile, target: CatalogDevice, source_device: str, achievable: Mapping[str, float],
                 dtype: str = "float32", sigma: float | None = None) -> list[dict[str, Any]]:
    """Predicted rows (layers and the whole model) for one catalog device, scaled from one measured device."""
    kind = next((str(k) for k in profile.summary.loc[profile.summary["device"] == source_device, "device_kind"]), "")
    base = {"device": target.id, "device_kind": target.kind, "source": PREDICTED, "predicted_from": source_device,
            "usd_per_hour": target.usd_per_hour, "price_source": target.price.get("source", "")}
    if target.kind == "gpu" and kind != "gpu":  # CPU -> GPU: the GPU model, from the work alone
        from tbs.predictions.reference import fitted_model

        return gpu_rows(profile, target, source_device, fitted_model(), base, dtype)
    calibration = profile.meta.calibration.get(source_device)
    src, dst = source_ceilings(calibration, dtype), target_ceilings(target, achievable, dtype)
    if src is None or dst is None:
        why = (f"{source_device} has no calibration in this profile" if src is None
               else f"the catalog lacks {target.id}'s peak FLOP/s or bandwidth")
        return not_predicted(profile, base, why)
    layers = _usable(profile.summary, source_device)
    spread = scaling_spread(layers.dropna(subset=["flops", "bytes_accessed", "median_s"]), src)
    if sigma is None:
        sigma = math.hypot(spread if spread is not None else SAME_KIND_SIGMA,
                           SAME_KIND_SIGMA if target.kind == kind else CROSS_KIND_SIGMA)
    datasheet = "; datasheet only (no published per-op measurement of this kind of device)" \
        if target.kind != kind else ""
    method = (f"{METHOD} from {source_device} ({profile.backend}){datasheet}; achievable {achievable['flops']:.0%} of peak "
              f"FLOP/s, {achievable['bandwidth']:.0%} of bandwidth; float32 matmul as {target.float32_matmul_runs_as}; "
              f"90% band x/÷{math.exp(Z90 * sigma):.2f}")
    out = []
    model = _usable(profile.model, source_device).assign(layer=MODEL_LAYER, layer_type="", category="model")
    for target_name, frame in (("layer", layers), ("model", model)):
        fits = fits_by_layer(frame, src, target_name == "model")
        for _, row in frame.iterrows():
            out.append(_predicted(row, target_name, base, (src, dst), sigma, method, target.kind,
                                  target.kind == kind, fits.get(str(row["layer"]))))
    return out


def predict_seconds(measured_s: float, work: tuple[float, float], src: Ceilings, dst: Ceilings, matmul: bool,
                    same_kind: bool, fit: LayerFit | None) -> float:
    """One cell's time on ``dst``: from the layer's fit where it has one, else scaled from this one measurement.

    The fitted overhead carries over to a device of the same kind only; another kind has its own
    (the launch floor stands in for it).
    """
    if fit is None:
        return scale_seconds(measured_s, work, work, src, dst, matmul, same_kind)
    return (fit.overhead_s if same_kind else 0.0) + fit.per_roofline * max(dst.roofline_s(*work, matmul))


def _predicted(row: pd.Series, target_name: str, base: dict[str, Any], ceilings_pair: tuple[Ceilings, Ceilings],
               sigma: float, method: str, kind: str, same_kind: bool, fit: LayerFit | None) -> dict[str, Any]:
    ident = dict(base, target=target_name, layer=row["layer"], layer_type=row.get("layer_type", ""),
                 category=row.get("category", ""), batch_size=int(row["batch_size"]), mode=row["mode"],
                 flops=row["flops"], bytes_accessed=row["bytes_accessed"])
    measured, flops, moved = row["median_s"], row["flops"], row["bytes_accessed"]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (measured, flops, moved)):
        return dict(ident, reason="not predicted: no compiler FLOPs/bytes for this cell on the measured device")
    src, dst = ceilings_pair
    matmul = row.get("category") in MATMUL_CATEGORIES or target_name == "model"
    scaled = predict_seconds(measured, (flops, moved), src, dst, matmul, same_kind, fit)
    compute_s, memory_s = dst.roofline_s(flops, moved, matmul)
    floor = LAUNCH_FLOOR_S.get(kind, 0.0)
    seconds = max(scaled, floor)
    factor = math.exp(Z90 * sigma)
    return dict(ident, method=method + (f"; launch floor {floor * 1e6:.0f} µs" if seconds == floor > scaled else ""),
                median_s=seconds, low_s=seconds / factor, high_s=seconds * factor,
                per_sample_s=seconds / int(row["batch_size"]), bound=bound_of(compute_s, memory_s, seconds),
                reason="")


def measured_device(name: str, kind: str, calibration: Mapping[str, Any]) -> CatalogDevice:
    """A measured device as a catalog row of its calibrated ceilings (already achievable: use fraction 1.0).

    The prediction benchmark predicts one measured configuration from another with it.
    """
    flops, bandwidth = ceilings(calibration)
    return CatalogDevice(id=name, kind=kind, name=name, unit="measured", peaks_flops_per_s={"float32": flops or 0.0},
                         float32_matmul_runs_as="float32", memory_bytes=None, memory_bandwidth_bytes_per_s=bandwidth, sm_count=None,
                         base_clock_hz=None, boost_clock_hz=None, l2_bytes=None, architecture="",
                         usd_per_hour=None, spot_usd_per_hour=None, price={}, spec_source="calibration", notes="")


def catalog_match(description: str, kind: str, catalog: Mapping[str, CatalogDevice]) -> CatalogDevice | None:
    """The one catalog accelerator a measured device is, by whole words of its description, or None.

    Every part of the id must be a word of the description ("NVIDIA A100-SXM4-80GB" is a100-80gb,
    not a100-40gb; "NVIDIA L40S" is not l4); two matches or none: no match.
    """
    import re

    words = set(re.split(r"[^a-z0-9]+", description.lower()))
    found = [c for c in catalog.values() if c.kind == kind and c.kind != "cpu"
             and all(part in words for part in c.id.split("-"))]
    return found[0] if len(found) == 1 else None


def fitted_achievable(profile: Profile, catalog: Mapping[str, CatalogDevice]) -> tuple[dict[str, float], str]:
    """The fraction of datasheet peaks reached, from measured devices that are in the catalog too.

    A measured device matches a catalog row by its description (e.g. "NVIDIA H100 80GB HBM3" ->
    h100). Without one, the defaults, and the method says so.
    """
    fractions: dict[str, list[float]] = {"flops": [], "bandwidth": []}
    for device in profile.meta.devices:
        match = catalog_match(str(device.get("description", "")), str(device.get("kind", "")), catalog)
        flops, bandwidth = ceilings(profile.meta.calibration.get(device.get("name")))
        if match is None:
            continue
        if flops and match.matmul_peak():
            fractions["flops"].append(flops / match.matmul_peak())
        if bandwidth and match.memory_bandwidth_bytes_per_s:
            fractions["bandwidth"].append(bandwidth / match.memory_bandwidth_bytes_per_s)
    fitted = {k: float(np.median(v)) if v else DEFAULT_ACHIEVABLE[k] for k, v in fractions.items()}
    how = "fitted on measured devices" if any(fractions.values()) else "defaults (no measured device is in the catalog)"
    return fitted, how


