"""Console tables: per batch size, layers down, devices across, per-sample time and cost."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from tbs.analysis import winner
from tbs.profile import Profile, with_layer_sums
from tbs.units import format_seconds, format_usd

PER_MILLION = 1_000_000


def _is_number(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _cell_text(row: pd.Series, fastest: str, cheapest: str, priced: bool) -> str:
    if row["status"] in ("oom", "error", "unsupported") or not _is_number(row["per_sample_s"]):
        return str(row["status"]).upper()
    text = format_seconds(row["per_sample_s"])
    if priced:
        cost = row["cost_per_sample_usd"]
        text += f" {format_usd(cost * PER_MILLION) if _is_number(cost) else 'no price'}"
    marks = fastest + cheapest
    if row["status"] not in ("ok",):
        marks += f" [{row['status']}]"
    return f"{text} {marks}".rstrip()


def _best(rows: pd.DataFrame, objective: str) -> tuple[set[str], bool]:
    """The winning device(s) and whether it is a tie (confidence intervals overlap)."""
    if len(rows) < 2:
        return set(), False
    result = winner(rows, objective)
    return set(result["devices"]), bool(result["tie"])


def batch_table(profile: Profile, batch_size: int) -> str:
    summary = profile.summary[profile.summary["batch_size"] == batch_size]
    devices = sorted(summary["device"].unique()) if not summary.empty else []
    priced = summary["cost_per_sample_usd"].map(_is_number).any() if not summary.empty else False
    order = [layer["name"] for layer in profile.metadata.get("layers", [])]
    rows = []
    for layer in order:
        cells = summary[summary["layer"] == layer]
        if cells.empty:
            continue
        (fastest, fast_tie), (cheapest, cheap_tie) = _best(cells, "time"), _best(cells, "cost")
        line = {"layer": layer, "category": cells.iloc[0]["category"]}
        for device in devices:
            cell = cells[cells["device"] == device]
            fast = ("~" if fast_tie else "*") if device in fastest else ""
            cheap = ("≈$" if cheap_tie else "$") if device in cheapest else ""
            line[device] = "" if cell.empty else _cell_text(cell.iloc[0], fast, cheap, priced)
        rows.append(line)
    model = with_layer_sums(profile.summary, profile.model)
    model = model[model["batch_size"] == batch_size] if not model.empty else model
    for label, column in (("Σ layers", "layers_sum_per_sample_s"), ("whole model", "per_sample_s")):
        line = {"layer": label, "category": ""}
        for device in devices:
            cell = model[model["device"] == device] if not model.empty else model
            value = cell.iloc[0][column] if not cell.empty else None
            status = str(cell.iloc[0].get("status", "")) if not cell.empty else ""
            failed = column == "per_sample_s" and status not in ("", "ok", "noisy")
            line[device] = format_seconds(value) if _is_number(value) else (status.upper() if failed else "-")
            if column == "layers_sum_per_sample_s" and _is_number(value):
                measured = int(cell.iloc[0]["layers_measured"])
                if measured < len(order):  # failed layers are not in the sum: say so
                    line[device] += f" ({measured} of {len(order)} layers)"
        rows.append(line)
    header = f"batch {batch_size}: time per sample"
    if priced:
        header += " and cost per 1M samples"
    legend = ("* fastest  $ cheapest  (~ / ≈$: tied within confidence intervals)  [status] where not ok"
              if len(devices) > 1 else "[status] where not ok")
    table = pd.DataFrame(rows).to_string(index=False) if rows else "(nothing measured)"
    lines = [header, table, legend]
    for _, m in (model.iterrows() if not model.empty else []):
        if _is_number(m.get("median_s")):
            lines.append(
                f"{m['device']}: whole model {format_seconds(m['median_s'])}/call; fixed costs apart: "
                f"dispatch {format_seconds(m.get('dispatch_overhead_s'))}/call, "
                f"input copy {format_seconds(m.get('input_copy_s'))}, first call {format_seconds(m.get('first_call_s'))}"
            )
        else:
            lines.append(f"{m['device']}: whole model {m.get('status')}: {m.get('reason')}")
    return "\n".join(lines)


def render(profile: Profile) -> str:
    batches = sorted(set(profile.summary["batch_size"].dropna().astype(int))) if not profile.summary.empty else []
    return "\n\n".join(batch_table(profile, b) for b in batches)


def comparison_table(rec: Any) -> list[dict[str, str]]:
    """Totals per sample, formatted for people (console and HTML)."""
    from tbs.recommend import comparison

    return [{"placement": row["name"], "time / sample": format_seconds(row["seconds_per_sample"]),
             "cost / 1M samples": "no price" if row["usd_per_1m_samples"] is None else format_usd(row["usd_per_1m_samples"])}
            for row in comparison(rec)]
