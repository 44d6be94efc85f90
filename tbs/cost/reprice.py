"""The one place where seconds become dollars: per-sample cost from USD per hour.

``cost_per_sample_usd`` is the formula; ``price_row`` prices a row as it is
measured; ``reprice`` prices a whole profile (a merged one too) with new prices
and spot discounts. A device without a price gets a blank cost, never 0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import pandas as pd

from tbs.profiles.profile import Profile
from tbs.units import is_number

SECONDS_PER_HOUR = 3600.0


def cost_per_sample_usd(per_sample_s: float | None, usd_per_hour: float | None) -> float | None:
    """per_sample_s x price / 3600; None when either is unknown."""
    return usd_per_batch(per_sample_s, usd_per_hour) if is_number(per_sample_s) else None


def usd_for_seconds(seconds: pd.Series, usd_per_hour: pd.Series) -> pd.Series:
    """Column-wise: what each row's seconds cost at its row's price (NaN where unpriced)."""
    return seconds * pd.to_numeric(usd_per_hour, errors="coerce") / SECONDS_PER_HOUR


def usd_per_batch(seconds: float, usd_per_hour: float | None) -> float | None:
    """What a device costs for ``seconds`` of work (None when it has no price)."""
    return None if not is_number(usd_per_hour) else seconds * usd_per_hour / SECONDS_PER_HOUR


def device_names(label: str) -> list[str]:
    """A merged device label and the names it may be priced by: 'box/gpu:0 (jax)' -> that, 'gpu:0 (jax)', 'gpu:0'."""
    names = [label]
    base = label.rsplit(" (", 1)[0] if label.endswith(")") else label
    for name in (label.split("/")[-1], base, base.split("/")[-1]):
        if name not in names:
            names.append(name)
    return names


def lookup(table: Mapping[str, float], device: str, kind: str | None) -> float | None:
    """A device's entry: exact (merged) label, then device name, then kind (``None``: by name only,
    as a predicted catalog device is); None when absent."""
    for key in device_names(device) + ([kind] if kind is not None else []):
        if key in table:
            return table[key]
    return None


def row_pricer(usd_per_hour: Mapping[str, float]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Prices a row as it is measured: its device's USD/hour and its cost per sample."""

    def price_row(row: dict[str, Any]) -> dict[str, Any]:
        price = lookup(usd_per_hour, str(row["device"]), str(row["device_kind"]))
        return dict(row, usd_per_hour=price, cost_per_sample_usd=cost_per_sample_usd(row.get("per_sample_s"), price))

    return price_row


def reprice(profile: Profile, usd_per_hour: Mapping[str, float], spot: Mapping[str, float] | None = None) -> Profile:
    """Cost columns recomputed from new prices: exact device label, then device name, then kind.

    A device the new prices do not name keeps the price it was profiled with,
    so re-pricing the GPU does not make the CPU unpriced.
    ``spot`` is a discount fraction per device key (0.7 = 70% off the listed price).
    """
    spot = spot or {}

    def apply(frame: pd.DataFrame, by_kind: bool = True) -> pd.DataFrame:
        if frame.empty:
            return frame
        frame = frame.copy()
        prices = []
        for device, kind, recorded in zip(frame["device"], frame["device_kind"], frame["usd_per_hour"]):
            # A predicted device (a catalog id) is priced by its own id only: "gpu=3" prices the
            # GPU the user measured, not every GPU in the catalog.
            price = lookup(usd_per_hour, device, kind if by_kind else None)
            if price is None and is_number(recorded):
                price = float(recorded)
            discount = lookup(spot, device, kind if by_kind else None) or 0.0
            prices.append(None if price is None else price * (1.0 - discount))
        frame["usd_per_hour"] = pd.Series(prices, index=frame.index, dtype="float64")
        frame["cost_per_sample_usd"] = usd_for_seconds(frame["per_sample_s"], frame["usd_per_hour"])
        return frame

    table = dict(profile.meta.prices_usd_per_hour)
    table.update(usd_per_hour)
    metadata = dict(profile.metadata, prices_usd_per_hour=table, spot_discount=dict(spot))
    return replace(profile, metadata=metadata, summary=apply(profile.summary), model=apply(profile.model),
                   predictions=apply(profile.predictions, by_kind=False))
