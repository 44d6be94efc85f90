"""What each cell's time means against its device's ceilings: achieved FLOP/s and GB/s, and its bound.

A cell's roofline time is max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth), with
the ceilings calibrated on the device itself (metadata ``calibration``). The fraction of
that time the cell really took says how close it runs to what the device can do, and
which limit binds: compute, memory, or neither (``overhead``: the time goes to dispatch,
latency, or work the compiler does not count).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from tbs.columns import ROOFLINE_COLUMNS
from tbs.schema import LayerRecord

# Below this fraction of the roofline, neither FLOPs nor bytes explain the time.
OVERHEAD_FRACTION = 0.2
BOUNDS = ("compute", "memory", "overhead")


def ceilings(calibration: Mapping[str, Any] | None, dtype: str = "float32") -> tuple[float | None, float | None]:
    """(achievable FLOP/s in ``dtype``, achievable bytes/s) from one device's calibration (None: not measured)."""
    if not calibration:
        return None, None
    flops = (calibration.get("matmul_flops_per_s") or {}).get(dtype)
    return (float(flops) if flops else None), (float(calibration["memory_bytes_per_s"])
                                               if calibration.get("memory_bytes_per_s") else None)


def sample_elements(shape: Any) -> int | None:
    """Elements of a shape after its batch axis (None where a dimension is unknown)."""
    if not isinstance(shape, (list, tuple)) or not shape:
        return None
    dims = list(shape[1:])
    if any(not isinstance(d, int) or d <= 0 for d in dims):
        return None
    return math.prod(dims)


def lookup_bytes(layer: LayerRecord | None, moved: float, batch: int) -> float:
    """An embedding lookup moves the rows it looks up, not its table.

    XLA's cost analysis counts a gather's whole operand (a 30,000 x 64 table read for 64 ids: 7.7 MB
    where the kernel reads 16 KB), so where the count holds the whole table (params x its itemsize),
    the table is taken out and the rows read (the output's size) put in. Once: a training
    row's backward and update are counted as they run (a dense optimizer update does touch the table).
    """
    if layer is None or not layer.params or not layer.output_bytes or not layer.batch_size:
        return moved
    elements = sample_elements((layer.output_shapes or [[]])[0])
    if not elements:
        return moved
    # The table is float32 unless the output is wider: under mixed precision Keras keeps variables in float32
    # and casts the looked-up rows to float16 or bfloat16.
    itemsize = max(layer.output_bytes / (elements * layer.batch_size), 4.0)
    table, rows = layer.params * itemsize, layer.output_bytes * batch / layer.batch_size
    return moved - table + rows if moved >= table else moved


def bound_of(compute_s: float, memory_s: float, measured_s: float) -> str:
    """compute / memory / overhead for one cell's roofline times and its measured time."""
    if not measured_s > 0 or max(compute_s, memory_s) < OVERHEAD_FRACTION * measured_s:
        return "overhead"
    return "compute" if compute_s >= memory_s else "memory"


def roofline_bytes(frame: pd.DataFrame, layers: Mapping[str, LayerRecord] | None) -> pd.Series:
    """The bytes each row's roofline divides by: the compiler's count, but an Embedding lookup's rows read
    rather than the whole table the count holds (``lookup_bytes``)."""
    moved = pd.to_numeric(frame["bytes_accessed"], errors="coerce")
    if not layers or "category" not in frame.columns:
        return moved
    lookups = frame["category"].eq("embedding") & moved.notna()
    for index in frame.index[lookups]:
        row = frame.loc[index]
        moved[index] = lookup_bytes(layers.get(str(row["layer"])), float(moved[index]), int(row["batch_size"]))
    return moved


def with_roofline(frame: pd.DataFrame, calibration: Mapping[str, Mapping[str, Any]] | None,
                  layers: Mapping[str, LayerRecord] | None = None) -> pd.DataFrame:
    """``frame`` (summary or model rows) with the roofline columns; blank where a figure is missing.
    ``layers`` (by name) lets an Embedding's roofline count the rows it reads."""
    frame = frame.copy()
    for column in ROOFLINE_COLUMNS:
        frame[column] = np.nan if column != "bound" else None
    if frame.empty or "flops" not in frame.columns:
        return frame
    flops = pd.to_numeric(frame["flops"], errors="coerce")
    moved = roofline_bytes(frame, layers)
    seconds = pd.to_numeric(frame["median_s"], errors="coerce")
    frame["arithmetic_intensity"] = flops / moved.where(moved > 0)
    frame["achieved_flops_per_s"] = flops / seconds.where(seconds > 0)
    frame["achieved_bytes_per_s"] = moved / seconds.where(seconds > 0)
    peaks = [ceilings((calibration or {}).get(str(d))) for d in frame["device"]]
    peak_flops = pd.Series([p[0] for p in peaks], index=frame.index, dtype=float)
    peak_bytes = pd.Series([p[1] for p in peaks], index=frame.index, dtype=float)
    compute_s, memory_s = flops / peak_flops, moved / peak_bytes
    roofline = pd.concat([compute_s, memory_s], axis=1).max(axis=1, skipna=False)
    frame["roofline_s"] = roofline
    frame["fraction_of_roofline"] = roofline / seconds.where(seconds > 0)
    known = roofline.notna() & seconds.notna()
    frame["bound"] = [bound_of(c, m, s) if k else None
                      for c, m, s, k in zip(compute_s, memory_s, seconds, known)]
    return frame
