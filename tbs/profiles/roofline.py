"""What each cell's time means against its device's ceilings: achieved FLOP/s and GB/s, and its bound.

A cell's roofline time is max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth), with
the ceilings calibrated on the device itself (metadata ``calibration``). The fraction of
that time the cell really took says how close it runs to what the device can do, and
which limit binds: compute, memory, or neither (``overhead``: the time goes to dispatch,
latency, or work the compiler does not count).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from tbs.schema import ROOFLINE_COLUMNS

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


def bound_of(compute_s: float, memory_s: float, measured_s: float) -> str:
    """compute / memory / overhead for one cell's roofline times and its measured time."""
    if not measured_s > 0 or max(compute_s, memory_s) < OVERHEAD_FRACTION * measured_s:
        return "overhead"
    return "compute" if compute_s >= memory_s else "memory"


def with_roofline(frame: pd.DataFrame, calibration: Mapping[str, Mapping[str, Any]] | None) -> pd.DataFrame:
    """``frame`` (summary or model rows) with the roofline columns; blank where a figure is missing."""
    frame = frame.copy()
    for column in ROOFLINE_COLUMNS:
        frame[column] = np.nan if column != "bound" else None
    if frame.empty or "flops" not in frame.columns:
        return frame
    flops = pd.to_numeric(frame["flops"], errors="coerce")
    moved = pd.to_numeric(frame["bytes_accessed"], errors="coerce")
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
