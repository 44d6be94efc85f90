"""Predicted cells for a catalog GPU from a profile measured on another kind of device (a CPU).

The measured times do not travel: a CPU's time says little about a GPU's. What travels is
what the layer asks for -- the compiler's FLOPs and bytes and the layer's shapes
(tbs.predictions.work) -- priced by the GPU model fitted on published GPU measurements
(tbs.predictions.gpu_model, tbs.predictions.reference). Each row says its kind, the GEMM it
was priced as, the precision assumed and a 90% band from that kind's residuals on the
reference data. The whole model is predicted from its compiled program where the profile recorded
its kernels (tbs.predictions.whole: the fused program's GEMMs and memory passes plus the step's host
overhead), each layer getting its share of that whole; else it is the sum of its layers' predictions
(a compiled model also fuses small layers: the sum leans high), and says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from tbs.backends.hlo_kernels import KERNEL_RULES
from tbs.predictions import whole
from tbs.predictions.catalog import CatalogDevice
from tbs.predictions.bands import regime
from tbs.predictions.gpu_model import GpuModel, GpuSpec, band_factors, frame_of, predict_frame
from tbs.predictions.work import MATMUL_CATEGORIES, MEMORY, RECURRENT, Work, work_of
from tbs.profiles.profile import Profile
from tbs.profiles.roofline import bound_of
from tbs.schema import MODEL_LAYER, USABLE, LayerRecord
from tbs.units import is_number

METHOD = "GPU model (published measurements)"
# String layers have no GPU kernels in TensorFlow: on a GPU machine they still run on its CPU.
# A layer whose outputs are its inputs in the mode profiled (Dropout, random augmentation in inference) is a view a
# compiled model drops: 0 s on any device, so a placement never keeps it on the host between two GPU layers.
IDENTITY_METHOD = "identity in this mode (a compiled model drops it: 0 s)"
HOST_ONLY_TYPES = ("TextVectorization", "StringLookup")
UNVALIDATED_WIDENING = 2.0  # a kind the reference data has no rows of: its band is widened this much each way
PRECISION_OF = {"float32": "fp32", "tf32": "tf32", "bfloat16": "fp16", "float16": "fp16"}


def gpu_spec(device: CatalogDevice) -> GpuSpec | None:
    """The catalog row as the GPU model's datasheet (None where it lacks SMs, a peak or bandwidth)."""
    peaks = {PRECISION_OF[k]: v for k, v in device.peaks_flops_per_s.items() if k in PRECISION_OF and k != "bfloat16"}
    if not (device.sm_count and peaks.get("fp32") and device.memory_bandwidth_bytes_per_s):
        return None
    return GpuSpec(device.id, device.sm_count, peaks, device.memory_bandwidth_bytes_per_s, device.base_clock_hz,
                   device.boost_clock_hz, device.l2_bytes, device.architecture)


def precision_of(device: CatalogDevice, dtype: str = "float32") -> str:
    """The precision a ``dtype`` matmul runs at there: float32 as TF32 on Ampere and later (Keras's default)."""
    used = device.float32_matmul_runs_as if dtype == "float32" else dtype
    return PRECISION_OF.get(used, "fp32")


def _band(model: GpuModel, work: Work, frame: pd.DataFrame) -> tuple[float, float, str]:
    """The row's 90% band multipliers (its kind's in its regime: ``frame`` is its ``frame_of`` table), and a note
    where its kind was not in the reference data."""
    found = band_factors(model, work.kind, float(regime(frame, model.launch_s)[0]), work.phase)
    if work.kind == RECURRENT and not work.fused:
        found = None  # the reference RNNs are cuDNN's fused kernels; a loop of kernels is not among them
    if found is not None:
        return found[0], found[1], ""
    widest = [band_factors(model, k) for k in model.bands]
    low = min((b[0] for b in widest if b), default=0.5) / UNVALIDATED_WIDENING
    high = max((b[1] for b in widest if b), default=2.0) * UNVALIDATED_WIDENING
    return low, high, "; not in the reference data: band widened"


def not_predicted(profile: Profile, base: dict[str, Any], why: str) -> list[dict[str, Any]]:
    """A device that cannot be predicted at all: one whole-model row per batch size saying why (a valid row
    of predictions.csv, so the profile still loads and every report shows the reason)."""
    return [dict(base, target="model", layer=MODEL_LAYER, batch_size=batch, mode=profile.mode,
                 reason=f"not predicted: {why}") for batch in profile.batch_sizes]


def gpu_rows(profile: Profile, target: CatalogDevice, source_device: str, model: GpuModel,
             base: dict[str, Any], dtype: str = "float32") -> list[dict[str, Any]]:
    """Predicted layer and whole-model rows for a GPU ``target`` from the work of ``source_device``'s rows."""
    spec = gpu_spec(target)
    if spec is None:
        return not_predicted(profile, base, f"the catalog lacks {target.id}'s SM count, FP32 peak or bandwidth")
    summary = profile.summary
    rows = summary[(summary["device"] == source_device) & summary["status"].isin(USABLE)].copy()
    for column in ("flops", "bytes_accessed"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce")
    layers = {layer.name: layer for layer in profile.layers}
    training = profile.mode == "training"
    precision = precision_of(target, dtype)
    out, seen = [], {}
    for _, row in rows.iterrows():
        out.append(_layer_row(row, layers.get(str(row["layer"])), profile.backend, training, spec, precision,
                              model, dict(base, predicted_from=source_device), seen))
    summed = _model_rows(out, rows, base)
    return out + [_fused_row(profile, source_device, row, out, spec, precision, model) for row in summed]


def _program_kernels(profile: Profile, device: str, batch: int, mode: str) -> list[dict[str, Any]] | None:
    """The kernels of the whole model's compiled program measured on ``device`` (every phase's), or None."""
    analysis = profile.analysis
    if not len(analysis) or "kernels" not in analysis:
        return None
    cell = analysis[(analysis["target"] == "model") & (analysis["device"] == device) & (analysis["mode"] == mode)
                    & (pd.to_numeric(analysis["batch_size"], errors="coerce") == batch)]
    found = [whole.parse_kernels(text) for text in cell["kernels"]]
    return None if not found or any(k is None for k in found) else [k for part in found for k in part]


def _older_kernels(profile: Profile) -> str:
    """What a whole-model prediction says where the profile's kernels were read by an older rule
    (tbs.backends.hlo_kernels.KERNEL_RULES): before 2, a BatchNorm's per-feature scale was folded into its
    convolution; before 3, a pooling the CPU computed inside the next convolution or dense layer was not a pass."""
    rules = profile.meta.kernel_rules or 1
    if rules >= KERNEL_RULES:
        return ""
    kinds = [str(layer.type) for layer in profile.layers]
    missed = [what for since, marker, what in (
        (2, "BatchNorm", "folded a BatchNorm after a convolution into it"),
        (3, "Pooling", "left a pooling inside the convolution or dense layer after it"))
        if rules < since and any(marker in kind for kind in kinds)]
    if not missed:
        return ""  # a model without those layers reads the same under every rule
    return (f"; its kernels were recorded by an older tbs, which {' and '.join(missed)} (a GPU runs each as a pass "
            "of its own; it reads fast): re-run tbs profile")


def _fused_row(profile: Profile, source_device: str, summed: dict[str, Any], layer_rows: list[dict[str, Any]],
               spec: GpuSpec, precision: str, model: GpuModel) -> dict[str, Any]:
    """The whole model from its compiled program's kernels where the profile has them (else the sum, as it was);
    each layer row gets its seconds inside that program and its share of it."""
    if summed.get("reason") or not is_number(summed.get("median_s")):
        return summed
    batch, mode = int(summed["batch_size"]), str(summed["mode"])
    kernels = _program_kernels(profile, source_device, batch, mode)
    if not kernels:
        return summed
    # A measured whole model is its program's time per call, its dispatch apart; so is this prediction. The host
    # overhead a framework's step adds (fitted on published end-to-end latencies) is said, not added: with it the
    # H200's measured whole models read up to 40x under their predictions (benchmarks/gpu_measured.md).
    names = [str(r["layer"]) for r in layer_rows]
    recurrent = _recurrent_rows(layer_rows, batch, mode)
    found = whole.predict_whole(whole.without_layers(kernels, recurrent, names), spec, precision, model,
                                host_overhead_s=0.0)
    host = float(sum(r.get("host_s") or 0.0 for r in layer_rows if r["batch_size"] == batch and r["mode"] == mode
                     and r.get("host_s") and str(r.get("in_step")) != "False"))
    seconds = found.seconds + host + _rnn_s(recurrent)
    inside = {**whole.layer_seconds(found, names), **{n: r["median_s"] for n, r in recurrent.items()}}
    for row in layer_rows:
        if row["batch_size"] == batch and row["mode"] == mode:
            row["in_model_s"] = inside.get(str(row["layer"]), 0.0) if "median_s" in row else None
            row["model_share"] = row["in_model_s"] / seconds if row["in_model_s"] is not None else None
    counts = found.counts()
    low, high = whole.WHOLE_BAND
    described = ", ".join(f"{counts[k]} {name}{'' if counts[k] == 1 else plural}" for k, name, plural in
                          (("conv", "convolution", "s"), ("gemm", "GEMM", "s"), ("memory", "memory pass", "es"))
                          if counts.get(k))
    return dict(summed, method=f"{whole.METHOD}: {described} of the whole program compiled for {source_device}, "
                               f"{precision} (a framework's step adds about {whole.HOST_OVERHEAD_S * 1e3:.2g} ms "
                               f"outside the program)"
                               f"{_recurrent_note(recurrent)}"
                               f"{' + the host-only layers measured on the CPU' if host else ''} "
                               f"(the sum of the isolated layers' predictions: {summed['median_s'] * 1e3:.3g} ms); "
                               f"{whole.BAND_PERCENT}% band{whole.TRAINING_CAVEAT if mode == 'training' else ''}"
                               f"{_older_kernels(profile)}",
                median_s=seconds, low_s=found.seconds * low + host + _rnn_s(recurrent, "low_s"),
                high_s=found.seconds * high + host + _rnn_s(recurrent, "high_s"),
                per_sample_s=seconds / batch, in_model_s=seconds, model_share=1.0)


def _recurrent_rows(layer_rows: list[dict[str, Any]], batch: int, mode: str) -> dict[str, dict[str, Any]]:
    """The predicted recurrent layers of one (batch, mode), by name: a GPU runs each as cuDNN's fused kernel or as
    its own compiled loop, which their layer predictions price (checked on the H200); the CPU program's loop of
    kernels, priced trip by trip, read the H200's RNN models 2.8-5.5x slow."""
    return {str(r["layer"]): r for r in layer_rows
            if r["batch_size"] == batch and r["mode"] == mode and r.get("category") == "rnn"
            and is_number(r.get("median_s")) and str(r.get("in_step")) != "False"}


def _rnn_s(recurrent: dict[str, dict[str, Any]], column: str = "median_s") -> float:
    return float(sum(r[column] for r in recurrent.values()))


def _recurrent_note(recurrent: dict[str, dict[str, Any]]) -> str:
    if not recurrent:
        return ""
    plural = "s" if len(recurrent) > 1 else ""
    return (f" + {', '.join(recurrent)} priced as the layer{plural} (its GPU kernel, not the program's loop; "
            f"its part of the band the layer's {whole.LAYER_BAND_PERCENT}%)")


def _activation_bytes(layer: LayerRecord | None, batch: int) -> float:
    """A layer's inputs and outputs at ``batch`` (the capture's sizes, scaled from its batch), or NaN."""
    return _captured_bytes(layer, batch, outputs_only=False)


def _captured_bytes(layer: LayerRecord | None, batch: int, outputs_only: bool) -> float:
    """The capture's sizes of a layer's outputs (and inputs), scaled from its batch to ``batch``; NaN if unknown."""
    if layer is None:
        return float("nan")
    sizes, captured = [layer.output_bytes] + ([] if outputs_only else [layer.input_bytes]), layer.batch_size
    if not all(is_number(v) for v in (*sizes, captured)) or not captured:
        return float("nan")
    return float(sum(sizes)) * batch / float(captured)


def layer_work(layer: LayerRecord | None, category: str, flops: Any, moved: Any, batch: int, backend: str,
               training: bool) -> Work | None:
    """The work a GPU prediction prices for one layer cell, from the compiler's counts on the measured device
    (None where they are missing for a layer that computes).

    A memory-bound layer's outputs are not written out in inference: its cell sums them inside the timing loop,
    as a compiled model fuses such a layer into the kernel that reads its output (tbs.backends.jax.device), so
    on a GPU it moves its inputs and weights (the H200's resolved memory-bound cells: predicted 2.2x their
    measured time with the output's write priced, 1.7x without; benchmarks/gpu_measured.md).
    """
    if category not in MATMUL_CATEGORIES:
        flops = flops if is_number(flops) else 0.0  # a layer that only moves data: no FLOPs is an answer
        moved = moved if is_number(moved) else _activation_bytes(layer, batch)  # what the compiler could not count
    if not all(is_number(v) for v in (flops, moved)):
        return None
    work = work_of(layer, category, float(flops), float(moved), batch, backend, training)
    written = _output_bytes(layer, batch)
    if work.kind == MEMORY and not training and is_number(written) and work.bytes > written:
        work = replace(work, bytes=work.bytes - written)
    return work


def _output_bytes(layer: LayerRecord | None, batch: int) -> float:
    """A layer's outputs at ``batch`` (the capture's size, scaled from its batch), or NaN."""
    return _captured_bytes(layer, batch, outputs_only=True)


def _priced(work: Work, precision: str, spec: GpuSpec, model: GpuModel, seen: dict[Work, tuple]) -> tuple:
    """The work's predicted seconds and its band (low and high multipliers, note). A model's repeated blocks ask
    for the same work many times (ResNet50's 176 layers at two batches), so each is priced once per device."""
    if work not in seen:
        frame = frame_of([work], [precision], [spec])
        seen[work] = (float(predict_frame(frame, model)[0]), *_band(model, work, frame))
    return seen[work]


def _layer_row(row: pd.Series, layer: LayerRecord | None, backend: str, training: bool, spec: GpuSpec,
               precision: str, model: GpuModel, base: dict[str, Any], seen: dict[Work, tuple]) -> dict[str, Any]:
    ident = dict(base, target="layer", layer=row["layer"], layer_type=row.get("layer_type", ""),
                 category=row.get("category", ""), batch_size=int(row["batch_size"]), mode=row["mode"],
                 flops=row["flops"], bytes_accessed=row["bytes_accessed"])
    if str(row.get("layer_type", "")) in HOST_ONLY_TYPES:
        return dict(ident, reason="not predicted: string layers run on the host CPU even on a GPU machine "
                                  "(TensorFlow has no GPU kernels for them)", host_s=float(row["median_s"]))
    if layer is not None and layer.inactive:  # known, not guessed: a GPU measured these at 0 s (profiles/h200)
        return dict(ident, method=IDENTITY_METHOD, median_s=0.0, low_s=0.0, high_s=0.0, per_sample_s=0.0,
                    bound="", reason="", in_step=row.get("in_step"))
    flops, moved = row["flops"], row["bytes_accessed"]
    work = layer_work(layer, str(row.get("category", "")), flops, moved, int(row["batch_size"]), backend, training)
    if work is None:
        return dict(ident, reason="not predicted: no compiler FLOPs/bytes for this cell on the measured device")
    seconds, low, high, note = _priced(work, precision, spec, model, seen)
    peak = spec.peak(precision) or spec.peak("fp32")
    return dict(ident, method=f"{METHOD}: {work.describe()}, {precision if work.kind != MEMORY else 'memory-bound'}"
                              f"{note}", median_s=seconds, low_s=seconds * low, high_s=seconds * high,
                per_sample_s=seconds / int(row["batch_size"]),
                bound=bound_of(float(flops) / peak, work.bytes / spec.memory_bandwidth_bytes_per_s, seconds),
                reason="", in_step=row.get("in_step"))


def _model_rows(layer_rows: list[dict[str, Any]], rows: pd.DataFrame, base: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole model per batch size: the sum of its layers' predictions (every layer must have one)."""
    out = []
    frame = pd.DataFrame(layer_rows)
    if not len(frame) or "median_s" not in frame:
        return out
    for (batch, mode), group in frame.groupby(["batch_size", "mode"]):
        counted = group[group["in_step"].astype(str) != "False"]
        if "host_s" not in counted:
            counted = counted.assign(host_s=np.nan)
        host = counted["host_s"].notna()
        ident = dict(base, target="model", layer=MODEL_LAYER, layer_type="", category="model",
                     batch_size=int(batch), mode=mode)
        if counted.loc[~host, "median_s"].isna().any():
            missing = ", ".join(map(str, counted.loc[~host & counted["median_s"].isna(), "layer"]))
            out.append(dict(ident, reason=f"not predicted: no prediction for {missing}"))
            continue
        host_s = float(counted.loc[host, "host_s"].sum()) if host.any() else 0.0
        on_cpu = counted.loc[host & (counted["host_s"] > 0), "layer"]
        on_host = (f" + the measured CPU time of {', '.join(map(str, on_cpu))}, which runs on the host"
                   if len(on_cpu) else "")
        seconds = float(counted.loc[~host, "median_s"].sum()) + host_s
        out.append(dict(ident, method=f"{METHOD}: the sum of the layers' predictions{on_host} (a compiled model "
                                      f"also fuses small layers: the sum leans high)",
                        median_s=seconds, low_s=float(counted.loc[~host, "low_s"].sum()) + host_s,
                        high_s=float(counted.loc[~host, "high_s"].sum()) + host_s,
                        per_sample_s=seconds / int(batch), flops=float(np.nansum(counted["flops"])),
                        bytes_accessed=float(np.nansum(counted["bytes_accessed"])), bound="", reason=""))
    return out
