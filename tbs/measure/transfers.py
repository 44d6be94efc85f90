"""Host<->device and device<->device copy cost per ordered pair: each timed size's median, and a line.

Placement needs what moving an activation costs inside a placed pass. Copies of several
sizes are timed (after a warm-up, each waited for); the raw samples are kept, and each
size's median (``points``). A timed copy includes the wait for it, which a pass pays
once (in its program call's dispatch, tbs.place), not per copy (on two logical CPUs a
4 KB copy timed at 160 µs). So a copy costs its timed time beyond the smallest timed
copy's: linear between two timed sizes, nothing below the smallest, the last two sizes'
slope above the largest. That leaves out a small copy's own cost in a pass: a two-layer
model replayed on the second logical CPU (its input copied there, its output back) took
110-160 µs more than on the first, ~60-80 µs a copy, priced at 0 here (to measure: the
smallest copy issued back to back, waited for once). A line alpha + beta * bytes is
fitted beside the points, but copies are not linear and least squares follows the largest
sizes: it priced an H200's 4 MB copy to its host (53 µs timed) at 3.4 ms. A profile
written before the points were kept prices through its raw samples where it kept them
(``fit_line`` reads them again), else through its line.
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
    points: tuple[tuple[float, float], ...] = ()  # (bytes, median seconds) per timed size, never decreasing

    def seconds(self, nbytes: float) -> float:
        """A copy of ``nbytes`` inside a placed pass: its timed time beyond the smallest timed copy's (the wait
        every timed copy includes); through the line where there are no points."""
        if not self.points:
            return self.alpha_s + self.beta_s_per_byte * nbytes
        sizes, times = zip(*self.points)
        if nbytes <= sizes[-1] or len(sizes) == 1:
            return float(np.interp(nbytes, sizes, times)) - times[0]
        slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        return times[-1] + slope * (nbytes - sizes[-1]) - times[0]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}
        if self.points:
            out["points"] = [list(p) for p in self.points]
        return out

    @classmethod
    def of(cls, record: dict[str, Any]) -> "TransferFit":
        """A fit as metadata.json keeps it (``points`` where the profile has them)."""
        return cls(float(record["alpha_s"]), float(record["beta_s_per_byte"]),
                   tuple((float(b), float(s)) for b, s in record.get("points") or ()))


def pair_key(src: str, dst: str) -> str:
    return f"{src}->{dst}"


def fit_line(nbytes: list[float], seconds: list[float]) -> TransferFit:
    """The per-size medians (robust to single outliers; made non-decreasing, as a larger copy never costs less),
    and a least-squares alpha + beta*bytes through them."""
    sizes = sorted(set(nbytes))
    medians = [float(np.median([s for b, s in zip(nbytes, seconds) if b == size])) for size in sizes]
    points = tuple(zip((float(b) for b in sizes), np.maximum.accumulate(medians).tolist()))
    if len(sizes) == 1:
        return TransferFit(max(medians[0], 0.0), 0.0, points)
    beta, alpha = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(medians), 1)
    return TransferFit(max(float(alpha), 0.0), max(float(beta), 0.0), points)


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
