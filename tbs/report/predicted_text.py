"""What ``tbs predict`` prints: per batch size, each layer's measured time beside its predicted devices.

Predicted cells are never mixed into the measured tables; here they stand beside the measured
device they were scaled from, each with its 90% band and cost per million samples, so a user
sees per layer where a prediction says a device wins and how wide the doubt is.
"""

from __future__ import annotations

import pandas as pd

from tbs.profiles.profile import Profile
from tbs.report.console import predicted_lines
from tbs.schema import MEASURED
from tbs.units import PER_MILLION, format_seconds, is_number

NOT_PREDICTED = "not predicted"


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(frame[column], errors="coerce") if column in frame else pd.Series(float("nan"), frame.index)


def _predicted_cell(row: pd.Series | None) -> str:
    """``time/sample [low – high]`` of one predicted cell; why not, where it was not predicted."""
    if row is None or not is_number(row.get("per_sample_s")):
        return NOT_PREDICTED
    batch = float(row["batch_size"])
    return (f"{format_seconds(row['per_sample_s'])} [{format_seconds(row['low_s'] / batch)} – "
            f"{format_seconds(row['high_s'] / batch)}]")


def _cost_cell(row: pd.Series | None) -> str:
    cost = None if row is None else row.get("cost_per_sample_usd")
    return f"${float(cost) * PER_MILLION:.3g}" if is_number(cost) else "no price"


def layer_table(profile: Profile, batch_size: int) -> str:
    """Layers down; the measured source device, then each predicted device's time [band] and $/1M across."""
    p = profile.predictions
    at = p[(p["target"] == "layer") & (_numbers(p, "batch_size") == batch_size)]
    sources = list(dict.fromkeys(at["predicted_from"].dropna()))
    measured = profile.summary[(profile.summary["batch_size"] == batch_size)
                               & profile.summary["status"].isin(MEASURED)]
    names = [l for l in dict.fromkeys(profile.summary["layer"]) if l in set(at["layer"])]
    names += [l for l in dict.fromkeys(at["layer"]) if l not in names and isinstance(l, str) and l]
    rows = []
    for name in names:
        line = {"layer": name}
        for source in sources:
            cell = measured[(measured["device"] == source) & (measured["layer"] == name)]
            line[f"{source} measured"] = format_seconds(cell["per_sample_s"].iloc[0]) if len(cell) else "-"
        for device, group in at.groupby("device", sort=False):
            found = group[group["layer"] == name]
            row = found.iloc[0] if len(found) else None
            line[f"{device} predicted [90%]"] = _predicted_cell(row)
            line[f"{device} $/1M"] = _cost_cell(row)
            if _numbers(group, "model_share").notna().any():  # predicted from the whole compiled program
                share = None if row is None else row.get("model_share")
                line[f"{device} share of model"] = f"{float(share):.1%}" if is_number(share) else "-"
        rows.append(line)
    return pd.DataFrame(rows).to_string(index=False) if rows else ""


def render(profile: Profile) -> str:
    """Every batch size's per-layer table, then the whole model per device (predicted, labelled)."""
    p = profile.predictions
    if p is None or p.empty:
        return "No predictions in this profile: run tbs predict PROFILE_DIR --device t4,h100 first."
    layers = p[p["target"] == "layer"]
    parts = []
    for batch in sorted(set(_numbers(layers, "batch_size").dropna().astype(int))):
        parts.append(f"batch {batch}: time per sample, measured beside predicted (not measured) "
                     f"[90% band], USD per 1M samples\n{layer_table(profile, batch)}")
    parts.append(predicted_lines(profile))
    return "\n\n".join(x for x in parts if x)
