"""Derived views of a profile that every renderer shares: winners with ties, crossovers.

A device wins a cell only when its confidence interval does not overlap the
runner-up's; otherwise the cell is a tie. Pure pandas, no measuring.
"""

from __future__ import annotations

import pandas as pd

from tbs.cost.reprice import usd_for_seconds
from tbs.schema import USABLE
from tbs.units import is_number


def _usable(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    ok = frame["status"].isin(USABLE) & frame[column].notna()
    return frame[ok]


def with_intervals(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-sample CI bounds for time and cost (cost CI = time CI x price)."""
    out = frame.copy()
    batch = out["batch_size"].astype(float)
    out["ci_low_per_sample_s"] = out["ci_low_s"] / batch
    out["ci_high_per_sample_s"] = out["ci_high_s"] / batch
    out["ci_low_cost_usd"] = usd_for_seconds(out["ci_low_per_sample_s"], out["usd_per_hour"])
    out["ci_high_cost_usd"] = usd_for_seconds(out["ci_high_per_sample_s"], out["usd_per_hour"])
    return out


def winner(cells: pd.DataFrame, objective: str = "time") -> dict[str, object]:
    """The fastest (or cheapest) device of one layer x batch, or a tie when CIs overlap."""
    column, low, high = (("per_sample_s", "ci_low_per_sample_s", "ci_high_per_sample_s") if objective == "time"
                         else ("cost_per_sample_usd", "ci_low_cost_usd", "ci_high_cost_usd"))
    usable = _usable(with_intervals(cells), column).sort_values(column)
    if usable.empty:
        return {"device": None, "tie": False, "devices": [], "label": "no data"}
    best = usable.iloc[0]
    tied = [r["device"] for _, r in usable.iterrows()
            if r["device"] == best["device"] or (is_number(r[low]) and r[low] <= best[high])]
    if len(usable) == 1:
        return {"device": best["device"], "tie": False, "devices": [best["device"]], "label": best["device"]}
    if len(tied) > 1:
        return {"device": None, "tie": True, "devices": tied, "label": "tie: " + " ≈ ".join(tied)}
    return {"device": best["device"], "tie": False, "devices": [best["device"]], "label": best["device"]}


def winners(summary: pd.DataFrame, objective: str = "time") -> pd.DataFrame:
    """One row per layer x batch size: the winner (or tie) for the objective."""
    rows = []
    for (layer, batch), cells in summary.groupby(["layer", "batch_size"], sort=False):
        rows.append({"layer": layer, "batch_size": batch, **winner(cells, objective)})
    return pd.DataFrame(rows, columns=["layer", "batch_size", "device", "tie", "devices", "label"])


def crossovers(table: pd.DataFrame) -> list[dict[str, object]]:
    """Where, as the batch grows, a layer's clear winner changes from one device to another."""
    found = []
    for layer, rows in table.groupby("layer", sort=False):
        clear = rows[rows["device"].notna()].sort_values("batch_size")
        previous = None
        for _, row in clear.iterrows():
            if previous is not None and row["device"] != previous["device"]:
                found.append({"layer": layer, "from_device": previous["device"], "to_device": row["device"],
                              "between": (int(previous["batch_size"]), int(row["batch_size"]))})
            previous = row
    return found
