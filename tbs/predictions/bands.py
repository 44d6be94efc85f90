"""The GPU model's 90% bands: per kind and regime, at a tail level a held-out GPU is covered at.

A layer's residual spread depends on its regime, known before anything is measured: a kernel
whose datasheet compute time dwarfs its memory time and launch runs at a steady share of the
peak, while a launch- or memory-bound one is noisier. The regime is
log10(compute / (memory + launch)) from the datasheet roofline, cut into ``REGIME_BUCKETS``
buckets of equal count per kind; each bucket gets its own residual percentiles (a bucket with
fewer than ``MIN_BUCKET_ROWS`` rows uses the kind's band).

A convolution's gradients (other cuDNN kernels than its forward's) spread wider than its forward:
its regime bands are fitted apart for the forward and for the gradient phases (``band_key``).

A band fitted on the rows it was fitted to under-covers a GPU it never saw, so the tail level
is chosen by leave-one-GPU-out within the fitted rows: the first of ``TAILS`` (5th/95th
percentiles first, then wider bands) whose bands, built without each GPU in turn, cover that GPU's
residuals ``TARGET_COVERAGE`` of the time on average.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

REGIME_BUCKETS = 4
MIN_BUCKET_ROWS = 150
TAILS = (0.05, 0.045, 0.04, 0.035, 0.03, 0.025, 0.02, 0.015, 0.01, 0.0075, 0.005)  # each side's share outside
TARGET_COVERAGE = 0.9
PHASE_SPLIT = ("conv",)  # kinds whose forward and gradients get their own regime bands
Band = tuple[float, float]


def regime(frame: pd.DataFrame, launch_s: float) -> np.ndarray:
    """log10(compute / (memory + launch)) per row from the datasheet: high is compute-bound, low launch/memory."""
    compute = frame["flops"].to_numpy(dtype=float) / frame["peak_flops_per_s"].to_numpy(dtype=float)
    memory = frame["bytes"].to_numpy(dtype=float) / frame["bandwidth_bytes_per_s"].to_numpy(dtype=float)
    return np.log10(np.maximum(np.nan_to_num(compute), 1e-12) / (np.nan_to_num(memory) + launch_s))


def band_key(kind: str, phase: str) -> str:
    """The regime bands a row uses: its kind's, or for a ``PHASE_SPLIT`` kind its forward's or gradients'."""
    return f"{kind}:gradients" if kind in PHASE_SPLIT and phase != "forward" else kind


def _edges(x: np.ndarray) -> list[float]:
    return [float(e) for e in np.unique(np.quantile(x, np.linspace(0, 1, REGIME_BUCKETS + 1)[1:-1]))]


def _bucket_bands(errors: np.ndarray, x: np.ndarray, edges: list[float], tail: float) -> list[Band]:
    """Each bucket's (low, high) log percentiles; the kind's where a bucket has too few rows."""
    whole = (float(np.quantile(errors, tail)), float(np.quantile(errors, 1 - tail)))
    bucket = np.digitize(x, edges)
    out = []
    for index in range(len(edges) + 1):
        chosen = errors[bucket == index]
        out.append((float(np.quantile(chosen, tail)), float(np.quantile(chosen, 1 - tail)))
                   if len(chosen) >= MIN_BUCKET_ROWS else whole)
    return out


def _lookup(bands: list[Band], edges: list[float], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bucket = np.digitize(x, edges)
    return np.array([bands[b][0] for b in bucket]), np.array([bands[b][1] for b in bucket])


def _tail(errors: np.ndarray, x: np.ndarray, devices: np.ndarray | None) -> float:
    """The largest tail share (the narrowest band) whose bands, built without each GPU, cover that GPU's
    residuals ``TARGET_COVERAGE`` of the time on average (the constants stay fitted on every row: a cheap, slightly optimistic estimate)."""
    groups = np.unique(devices) if devices is not None else []
    if len(groups) < 3:
        return TAILS[0]
    for tail in TAILS:
        covered = []
        for group in groups:
            out = devices != group
            edges = _edges(x[out])
            low, high = _lookup(_bucket_bands(errors[out], x[out], edges, tail), edges, x[~out])
            covered.append(float(((errors[~out] >= low) & (errors[~out] <= high)).mean()))
        if np.mean(covered) >= TARGET_COVERAGE:
            return tail
    return TAILS[-1]


def fit_bands(kinds: np.ndarray, errors: np.ndarray, x: np.ndarray, devices: np.ndarray | None,
              phases: np.ndarray | None = None) -> tuple[dict[str, Band], dict[str, dict[str, Any]]]:
    """Per kind its whole band, and per ``band_key`` its regime bands ({edges, bands, tail}), from log residuals
    log(measured / predicted)."""
    keys = np.array([band_key(k, p) for k, p in zip(kinds, phases)]) if phases is not None else kinds
    whole, regimes, tails = {}, {}, {}
    for key in sorted(set(keys)):
        chosen = keys == key
        tails[key] = tail = _tail(errors[chosen], x[chosen], devices[chosen] if devices is not None else None)
        edges = _edges(x[chosen])
        regimes[str(key)] = {"edges": edges, "bands": _bucket_bands(errors[chosen], x[chosen], edges, tail), "tail": tail}
    for kind in sorted(set(kinds)):
        chosen = kinds == kind
        tail = min(t for key, t in tails.items() if key.split(":")[0] == kind)
        whole[str(kind)] = (float(np.quantile(errors[chosen], tail)), float(np.quantile(errors[chosen], 1 - tail)))
    return whole, regimes


def regime_band(regimes: dict[str, dict[str, Any]], kind: str, x: float) -> Band | None:
    """The (low, high) log band of a ``kind`` row at regime ``x``, or None without regime bands for it."""
    found = regimes.get(kind)
    if not found or not math.isfinite(x):
        return None
    low, high = _lookup([tuple(b) for b in found["bands"]], list(found["edges"]), np.array([x]))
    return float(low[0]), float(high[0])
