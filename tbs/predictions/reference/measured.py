"""tbs's own GPU measurements as reference rows: the third source (``tbs``) beside DeepBench and NeuSight.

A row is one layer cell that tbs measured on a GPU (``profiles/<gpu>/``), described by the work a
``tbs predict`` of that layer would price: the layer's shapes and the CPU compiler's FLOPs and bytes
for the same layer and batch (XLA:GPU's cost analysis gives no FLOPs for cuDNN's and cuBLAS's custom
calls, so the GPU's own counts cannot describe a convolution or a GEMM). Left out, and why:

- cells timed before the harness fix: their timing loop read 0 s an iteration (XLA had deleted the empty
  loop), so each still carries the loop's ~22 us per call on an H200 (read per cell: a resumed profile can
  hold cells of both harnesses);
- cells shorter than one iteration of their own timing loop (~22 us on an H200, most of it the host driving
  the loop): the loop's cost, subtracted, overlaps such a kernel, so what is left is not the kernel's time
  (ResNet50's BatchNorms read 2.7 us for 51 MB, 19 TB/s, past the H200's memory and L2); cells whose
  confidence interval reaches 0, and cells not ``ok``;
- layers a mode leaves idle, layers with no CPU row at that batch (no work to describe them with), and a
  layer that shares another identical layer's measurement (``shared_with``): that cell is one row, not two.

The image classifiers (``CHECK_ONLY_MODELS``) are written out but never fitted on: they are the
independent check of whatever the other rows change.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Iterable

import pandas as pd

from tbs.predictions.gpu_predict import layer_work
from tbs.predictions.work import Work
from tbs.profiles.profile import Profile
from tbs.schema import LayerRecord

SOURCE = "tbs"
MEASURED = "measured.csv"
CHECK_ONLY_MODELS = ("resnet50", "efficientnetb0")
WORK_COLUMNS = [f.name for f in fields(Work) if f.name != "input_gemm"] + ["in_m", "in_n", "in_k"]
COLUMNS = ["source", "device", "precision", "model", "layer", "category", "batch", "mode", *WORK_COLUMNS,
           "measured_seconds", "ci_low_s", "ci_high_s", "check_only", "framework", "profile"]


def loop_seconds(samples: pd.DataFrame, device: str) -> dict[tuple[str, int], float]:
    """Per (layer, batch) of ``device``, the median cost of one iteration of the cell's timing loop, as its own
    samples recorded it (0: the loop XLA deleted). Per cell: a resumed profile can hold cells of both harnesses."""
    rows = samples[samples["device"] == device]
    loop = pd.to_numeric(rows["harness_iteration_s"], errors="coerce")
    per_cell = loop.groupby([rows["layer"].astype(str), rows["batch_size"].astype(int)]).median()
    return {(str(layer), int(b)): float(value) if value > 0 else 0.0 for (layer, b), value in per_cell.items()}


def stale_batches(samples: pd.DataFrame, device: str) -> set[int]:
    """``device``'s batches with a cell whose timing loop read 0 s an iteration (timed before the harness fix)."""
    return {batch for (_, batch), seconds in loop_seconds(samples, device).items() if not seconds > 0}


def _cpu_rows(profiles: Iterable[Profile]) -> dict[tuple[str, int], pd.Series]:
    """(layer, batch) -> its CPU row in the first of ``profiles`` that has one (the GPU profile's host first)."""
    out: dict[tuple[str, int], pd.Series] = {}
    for profile in profiles:
        summary = profile.summary
        for _, row in summary[summary["device_kind"].astype(str) == "cpu"].iterrows():
            out.setdefault((str(row["layer"]), int(row["batch_size"])), row)
    return out


def _work(row: pd.Series, cpu: pd.Series, profile: Profile, layer: LayerRecord | None, batch: int) -> Work | None:
    """The work a ``tbs predict`` of this layer prices (``gpu_predict.layer_work``), from the CPU row's counts."""
    if layer is None or layer.inactive:
        return None
    flops, moved = pd.to_numeric(cpu["flops"], errors="coerce"), pd.to_numeric(cpu["bytes_accessed"], errors="coerce")
    return layer_work(layer, str(row["category"]), flops, moved, batch, profile.backend, profile.mode == "training")


def measured_rows(profile: Profile, cpu_profiles: Iterable[Profile], model: str, device_id: str,
                  precision: str, where: str = "") -> pd.DataFrame:
    """The resolved inference layer cells of ``profile``'s GPUs as reference rows (see the module's notes)."""
    cpu = _cpu_rows([profile, *cpu_profiles])
    layers = {layer.name: layer for layer in profile.layers}
    summary = profile.summary
    rows = []
    gpu = summary[(summary["device_kind"].astype(str) == "gpu") & (summary["status"] == "ok")]
    for device, cells in gpu.groupby("device"):
        loop = loop_seconds(profile.samples, str(device))
        for _, row in cells.iterrows():
            batch, seconds = int(row["batch_size"]), float(row["median_s"])
            low = pd.to_numeric(row["ci_low_s"], errors="coerce")
            found = cpu.get((str(row["layer"]), batch))
            # a layer sharing another's cell has no samples of its own: 0 here, its owner is the row
            iteration = loop.get((str(row["layer"]), batch), 0.0)
            if not iteration > 0 or not seconds >= iteration or not low > 0 or found is None:
                continue
            work = _work(row, found, profile, layers.get(str(row["layer"])), batch)
            if work is None:
                continue
            in_m, in_n, in_k = work.input_gemm or (0, 0, 0)
            rows.append({"source": SOURCE, "device": device_id, "precision": precision, "model": model,
                         "layer": row["layer"], "category": row["category"], "batch": batch, "mode": profile.mode,
                         **{f.name: getattr(work, f.name) for f in fields(Work) if f.name != "input_gemm"},
                         "in_m": in_m, "in_n": in_n, "in_k": in_k, "measured_seconds": seconds,
                         "ci_low_s": float(low), "ci_high_s": float(row["ci_high_s"]),
                         "check_only": model in CHECK_ONLY_MODELS, "framework": f"{profile.backend}-xla",
                         "profile": where})
    return pd.DataFrame(rows, columns=COLUMNS)


def works_of(table: pd.DataFrame) -> list[Work]:
    """measured.csv's rows back to the works they describe."""
    out = []
    for _, row in table.iterrows():
        values = {f.name: row[f.name] for f in fields(Work) if f.name != "input_gemm"}
        for name in ("m", "n", "k", "count", "steps", "window", "stride"):
            values[name] = int(values[name])
        for name in ("fused", "in_program", "winograd", "tensor_core_aligned"):
            values[name] = str(values[name]) == "True"
        values["flops"], values["bytes"] = float(values["flops"]), float(values["bytes"])
        gemm = tuple(int(row[c]) for c in ("in_m", "in_n", "in_k"))
        out.append(Work(**values, input_gemm=gemm if gemm[0] else None))
    return out
