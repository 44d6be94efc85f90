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
    return _winner(with_intervals(cells), objective)


def _winner(cells: pd.DataFrame, objective: str) -> dict[str, object]:
    """``winner`` of cells that already carry their intervals (``with_intervals``)."""
    column, low, high = (("per_sample_s", "ci_low_per_sample_s", "ci_high_per_sample_s") if objective == "time"
                         else ("cost_per_sample_usd", "ci_low_cost_usd", "ci_high_cost_usd"))
    usable = _usable(cells, column).sort_values(column)
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
    rows = []  # the intervals once for the whole table: per group they were most of a large model's report
    for (layer, batch), cells in with_intervals(summary).groupby(["layer", "batch_size"], sort=False):
        rows.append({"layer": layer, "batch_size": batch, **_winner(cells, objective)})
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


# ----- training profiles ------------------------------------------------------------------------

PHASES = ("forward", "backward", "update")


def phase_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per layer x device x batch x phase with seconds and USD per sample (NaN stays NaN).

    A phase the layer does not have (0.0 in the profile) is kept as 0; a failed phase
    (blank in the profile) stays NaN so it is drawn and summed as missing, never as 0.
    """
    rows = []
    for phase in PHASES:
        column = f"{phase}_s"
        if column not in summary.columns or summary.empty:
            continue
        part = summary[["layer", "device", "batch_size", "status", "usd_per_hour", "phases"]].copy()
        part["phase"] = phase
        part["seconds_per_sample"] = pd.to_numeric(summary[column], errors="coerce") / summary["batch_size"]
        part["usd_per_sample"] = usd_for_seconds(part["seconds_per_sample"], part["usd_per_hour"])
        rows.append(part)
    columns = ["layer", "device", "batch_size", "status", "usd_per_hour", "phases", "phase", "seconds_per_sample",
               "usd_per_sample"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=columns)


def step_check(summary: pd.DataFrame, model: pd.DataFrame, loss_layer: str) -> pd.DataFrame:
    """Per device x batch: Σ of each phase over the layers, the loss, their total, and the whole train step.

    ``model`` carries ``layers_sum_s`` (Σ of every row's median, the loss included); a
    phase's Σ covers only the rows where it was measured (``layers_measured`` says how many rows).
    """
    out = []
    for _, m in model.iterrows():
        rows = summary[(summary["device"] == m["device"]) & (summary["batch_size"] == m["batch_size"])]
        layers, loss = rows[rows["layer"] != loss_layer], rows[rows["layer"] == loss_layer]
        sums = {f"{p}_sum_s": pd.to_numeric(layers[f"{p}_s"], errors="coerce").sum(min_count=1) for p in PHASES}
        loss_s = pd.to_numeric(loss["median_s"], errors="coerce").sum(min_count=1)
        whole = m.get("median_s")
        total = m.get("layers_sum_s")
        out.append({"device": m["device"], "batch_size": m["batch_size"], **sums, "loss_s": loss_s,
                    "layers_sum_s": total, "layers_measured": m.get("layers_measured"), "rows": len(rows),
                    "step_s": whole, "sum_over_step": total / whole if is_number(total) and is_number(whole)
                    and whole else float("nan")})
    return pd.DataFrame(out, columns=["device", "batch_size", *(f"{p}_sum_s" for p in PHASES), "loss_s",
                                      "layers_sum_s", "layers_measured", "rows", "step_s", "sum_over_step"])


def training_memory(summary: pd.DataFrame, layers: list[str]) -> pd.DataFrame:
    """Per layer (model order): weights, optimizer slots and, per batch size, the residual activations.

    Devices usually agree; where they do not, the largest is kept (what must fit), and
    ``residual_unknown@B`` names the devices that did not say. Unknown stays NaN, never 0.
    """
    if summary.empty:
        return pd.DataFrame(columns=["layer", "weight_bytes", "slot_bytes"])
    numeric = summary.assign(**{c: pd.to_numeric(summary[c], errors="coerce")
                                for c in ("weight_bytes", "slot_bytes", "residual_bytes")})
    table = numeric.groupby("layer")[["weight_bytes", "slot_bytes"]].max()
    for batch, rows in numeric.groupby("batch_size"):
        table[f"residual_bytes@{batch}"] = rows.groupby("layer")["residual_bytes"].max()
        unknown = rows[rows["residual_bytes"].isna()].groupby("layer")["device"].agg(lambda d: ", ".join(sorted(d)))
        table[f"residual_unknown@{batch}"] = unknown.reindex(table.index).fillna("")
    table = table.reindex([l for l in layers if l in table.index])
    return table.rename_axis("layer").reset_index()


def _best(cells: pd.DataFrame, objective: str) -> dict[str, object]:
    result = winner(cells, objective)
    column = "per_sample_s" if objective == "time" else "cost_per_sample_usd"
    value = cells.set_index("device")[column].get(result["devices"][0]) if result["devices"] else None
    return {**result, "value": value}


def mode_differences(inference: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """Per layer and batch size common to both: each mode's cheapest device, and whether they differ.

    Compared by cost per sample where every usable cell of both modes has a price,
    otherwise by time per sample (``by`` says which). Ties (overlapping confidence
    intervals) count as a difference only when the two sets of best devices share none.
    """
    rows = []
    common = set(inference["batch_size"].dropna().astype(int)) & set(training["batch_size"].dropna().astype(int))
    order = list(dict.fromkeys(training["layer"]))
    for layer in [l for l in order if l in set(inference["layer"])]:
        for batch in sorted(common):
            cells = {mode: frame[(frame["layer"] == layer) & (frame["batch_size"] == batch)
                                 & frame["status"].isin(USABLE) & frame["per_sample_s"].notna()]
                     for mode, frame in (("inference", inference), ("training", training))}
            if any(c.empty for c in cells.values()):
                continue
            priced = all(c["cost_per_sample_usd"].notna().all() for c in cells.values())
            objective = "cost" if priced else "time"
            best = {mode: _best(c, objective) for mode, c in cells.items()}
            differs = not set(best["inference"]["devices"]) & set(best["training"]["devices"])
            rows.append({"layer": layer, "batch_size": batch, "by": objective,
                         "inference": best["inference"]["label"], "inference_value": best["inference"]["value"],
                         "training": best["training"]["label"], "training_value": best["training"]["value"],
                         "differs": differs})
    return pd.DataFrame(rows, columns=["layer", "batch_size", "by", "inference", "inference_value", "training",
                                       "training_value", "differs"])
