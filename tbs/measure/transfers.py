"""Host<->device and device<->device copy cost: alpha + beta * bytes per ordered pair.

Placement needs what moving an activation costs. Copies of several sizes are
timed (after a warm-up, with the destination synchronised) and a line is fitted
per ordered device pair; the raw samples are kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tbs.backends.base import Device

SIZES_BYTES = (4_096, 262_144, 4_194_304, 33_554_432)
REPEATS = 7


@dataclass(frozen=True)
class TransferFit:
    alpha_s: float
    beta_s_per_byte: float

    def seconds(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    def as_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}


def pair_key(src: str, dst: str) -> str:
    return f"{src}->{dst}"


def fit_line(nbytes: list[float], seconds: list[float]) -> TransferFit:
    """Least-squares alpha + beta*bytes on the per-size medians (robust to single outliers)."""
    sizes = sorted(set(nbytes))
    medians = [float(np.median([s for b, s in zip(nbytes, seconds) if b == size])) for size in sizes]
    if len(sizes) == 1:
        return TransferFit(max(medians[0], 0.0), 0.0)
    beta, alpha = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(medians), 1)
    return TransferFit(max(float(alpha), 0.0), max(float(beta), 0.0))


def timed_copies(dst: Device, source: Any, repeats: int = REPEATS,
                 clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` copies of ``source`` (an array or a model's inputs) onto ``dst``, synchronised."""
    seconds = []
    for _ in range(repeats):
        start = clock()
        copied = dst.place(source)
        dst.sync()
        seconds.append(clock() - start)
        del copied
    return seconds


def measure(devices: list[Device], host: Device, sizes: tuple[int, ...] = SIZES_BYTES,
            repeats: int = REPEATS) -> tuple[list[dict[str, object]], dict[str, TransferFit]]:
    """Time copies between every ordered pair of distinct devices (the host included)."""
    everyone = [host] + [d for d in devices if d.name != host.name]
    rows: list[dict[str, object]] = []
    fits: dict[str, TransferFit] = {}
    for src in everyone:
        for dst in everyone:
            if src.name == dst.name:
                continue
            xs, ys = [], []
            for size in sizes:
                source = src.place(np.zeros(size // 4, dtype=np.float32))
                src.sync()
                for _ in range(2):  # warm-up: allocators, first-copy setup
                    dst.place(source)
                    dst.sync()
                for i, seconds in enumerate(timed_copies(dst, source, repeats)):
                    rows.append({"src": src.name, "dst": dst.name, "bytes": size, "sample": i, "seconds": seconds})
                    xs.append(size)
                    ys.append(seconds)
            fits[pair_key(src.name, dst.name)] = fit_line(xs, ys)
    return rows, fits
