"""Whether a value is a number, and formatting of seconds and dollars for people (data stays in SI units)."""

from __future__ import annotations

import math


PER_MILLION = 1_000_000  # costs are shown per 1M samples


def is_number(value: object) -> bool:
    """Whether a value is a real, finite-or-infinite number (not None, NaN, text or a bool): the one test."""
    if value is None or isinstance(value, (bool, str)):
        return False
    try:
        return not math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _missing(value: object) -> bool:
    return not is_number(value)


def format_seconds(seconds: float | None) -> str:
    if _missing(seconds):
        return "-"
    s = float(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale or unit == "ns":
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def format_usd(usd: float | None) -> str:
    if _missing(usd):
        return "no price"
    value = float(usd)
    if value == 0:
        return "$0"
    if abs(value) >= 0.01:
        return f"${value:,.2f}"
    return f"${value:.3g}"


def format_bytes(value: object) -> str:
    """Bytes for people; blank where unknown (never "0 B" for a value nobody measured)."""
    if not is_number(value):
        return ""
    size = float(value)  # type: ignore[arg-type]
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"
