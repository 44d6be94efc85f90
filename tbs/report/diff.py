"""A Diff as text (a terminal), markdown (a CI comment) or JSON (a program).

The same content in each: who is compared and what the header must say (another machine,
the same model file, different prices), whether the gate fails, the whole model per device
and batch, the layer cells that changed (every cell with ``every_cell``), how layers were
matched, what only one side measured, and predicted cells apart. Nothing here compares.
"""

from __future__ import annotations

import json as _json
from typing import Any, Callable

import pandas as pd

from tbs.compare import Diff, verdict as v
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number
from tbs.predictions.whole import band_percent

FORMATS = ("text", "markdown", "json")
# What a row of the layer table is, in the order the table shows them.
SHOWN = (v.FAILED, v.SLOWER, v.FASTER, v.FIXED, v.ADDED, v.REMOVED, v.ONLY_BASE, v.ONLY_NEW)
UNJUDGED = (v.BELOW_RESOLUTION, v.NO_SAMPLES, v.TOO_FEW, v.NOT_MEASURED)


def _percent(value: Any) -> str:
    return f"{float(value):+.1%}" if is_number(value) else ""


def _interval(row: pd.Series) -> str:
    low, high = row.get("time_change_low"), row.get("time_change_high")
    if is_number(low) and is_number(high):
        return f"{_percent(low)} .. {_percent(high)}"
    return "unbounded" if is_number(row.get("p_value")) else ""  # a resampled median of 0: no ratio holds


def _verdict(row: pd.Series) -> str:
    text = str(row["verdict"])
    if text in (v.SLOWER, v.FASTER):
        confidence = float(row["confidence"])
        shown = ">99.99" if confidence > 0.9999 else f"{confidence * 100:.2f}".rstrip("0").rstrip(".")
        text += f" ({shown}% sure)"
    if text == v.FAILED:
        text += f" ({row.get('status_new')})"
    if text == v.FIXED:
        text += f" (was {row.get('status_base')})"
    if bool(row.get("regression")):
        text = "REGRESSION: " + text
    return text


def _cost(value: Any) -> str:
    return format_usd(float(value) * PER_MILLION) if is_number(value) else ""


def _table_rows(cells: pd.DataFrame, with_layer: bool, priced: bool) -> list[dict[str, str]]:
    rows = []
    for _, row in cells.iterrows():
        line = {}
        if with_layer:
            renamed = row["match"] == "renamed"
            line["layer"] = f"{row['base_layer']} -> {row['layer']}" if renamed else str(row["layer"])
        line.update({"device": str(row["device"]), "batch": str(row["batch_size"]),
                     "base": format_seconds(row["base_per_sample_s"]) if is_number(row["base_per_sample_s"]) else "",
                     "new": format_seconds(row["new_per_sample_s"]) if is_number(row["new_per_sample_s"]) else "",
                     "change": _percent(row["time_change"]), "interval": _interval(row), "verdict": _verdict(row)})
        if priced:
            line.update({"cost/1M base": _cost(row["base_cost_per_sample_usd"]),
                         "cost/1M new": _cost(row["new_cost_per_sample_usd"]), "cost change": _percent(row["cost_change"])})
        rows.append(line)
    return rows


def _shown(layers: pd.DataFrame, every_cell: bool) -> pd.DataFrame:
    """The layer cells a table shows: regressions first, then by verdict and the size of the change."""
    picked = layers if every_cell else layers[layers["verdict"].isin(SHOWN)]
    rank = {name: i for i, name in enumerate(SHOWN)}
    order = picked.assign(_r=[-1 if bool(g) else rank.get(str(x), len(rank)) for g, x in
                              zip(picked["regression"], picked["verdict"])],
                          _c=-picked["time_change"].astype(float).abs().fillna(0))
    return order.sort_values(["_r", "_c"], kind="stable").drop(columns=["_r", "_c"])


def _counts(cells: pd.DataFrame) -> str:
    counts = cells["verdict"].value_counts()
    return ", ".join(f"{n} {name}" for name, n in counts.items())


def _header(d: Diff) -> list[str]:
    cells = d.cells
    tested = int(cells["p_value"].notna().sum())
    lines = [f"BASE {d.base.directory} ({d.base.model}, {d.base.status or '?'}, started {d.base.started or '?'})",
             f"NEW  {d.new.directory} ({d.new.model}, {d.new.status or '?'}, started {d.new.started or '?'})",
             f"{d.new.mode} on {d.new.backend}; devices {', '.join(d.devices) or 'none in common'}; batch sizes "
             f"{', '.join(map(str, d.batch_sizes)) or 'none in common'}"]
    lines += d.notes
    lines.append(f"Verdicts: the change in median time, its {d.confidence:.0%} interval from both sides' raw samples "
                 f"(bootstrap); slower or faster only where significant across the {tested} cell{'' if tested == 1 else 's'} tested "
                 f"(Benjamini-Hochberg); the gate ({'whole model only' if d.gate == 'model' else 'any cell'}): "
                 f"slower by more than {d.threshold:.0%}, or failing where BASE ran.")
    return lines


def _gate_line(d: Diff) -> str:
    regressions = d.regressions
    if regressions.empty:
        return f"No regression beyond {d.threshold:.0%}."
    names = [f"{'whole model' if r['target'] == 'model' else r['layer']} on {r['device']} at batch {r['batch_size']}"
             for _, r in regressions.head(5).iterrows()]
    more = f" and {len(regressions) - 5} more" if len(regressions) > 5 else ""
    return f"REGRESSION: {len(regressions)} cell(s) slower beyond noise by more than {d.threshold:.0%} or failing: " \
           f"{'; '.join(names)}{more}."


def _matching(d: Diff) -> list[str]:
    lines = []
    for kind in ("renamed", "added", "removed"):
        rows = d.layers[d.layers["match"] == kind]
        if rows.empty:
            continue
        if kind == "renamed":
            items = [f"{r['base_layer']} -> {r['new_layer']} ({r['how']})" for _, r in rows.iterrows()]
        else:
            items = [f"{r['new_layer'] if kind == 'added' else r['base_layer']} ({r['layer_type']})"
                     for _, r in rows.iterrows()]
        lines.append(f"Layers {kind}: {'; '.join(items)}")
    changed = d.layers[(d.layers["match"] == "same") & (d.layers["how"] != "")]
    if not changed.empty:
        lines.append(f"Layers whose shapes changed: {', '.join(changed['new_layer'])}")
    for what, only in (("Devices", d.devices_only), ("Batch sizes", d.batch_sizes_only)):
        for side in ("base", "new"):
            if only.get(side):
                lines.append(f"{what} only in {side.upper()} (not compared): {', '.join(map(str, only[side]))}")
    return lines


def _predicted_rows(d: Diff) -> list[dict[str, str]]:
    rows = []
    for _, r in d.predicted.iterrows():
        level = band_percent([r["base_method"], r["new_method"]])
        band = (lambda side: f"{format_seconds(r[f'{side}_median_s'])} ({format_seconds(r[f'{side}_low_s'])}"
                             f"-{format_seconds(r[f'{side}_high_s'])})")
        rows.append({"layer": "whole model" if r["target"] == "model" else str(r["layer"]), "device": str(r["device"]),
                     "batch": str(r["batch_size"]), f"base ({level} band)": band("base"), f"new ({level} band)": band("new"),
                     "change": _percent(r["time_change"]), "method": str(r["new_method"])})
    return rows


def _sections(d: Diff, every_cell: bool, table: Callable[[list[dict[str, str]]], str],
              lines: Callable[[list[str]], str]) -> list[tuple[str, str]]:
    """(title, body) of each section, in order, for one format's tables and lists of lines."""
    cells = d.cells
    priced = bool(cells["base_cost_per_sample_usd"].map(is_number).any() and
                  cells["new_cost_per_sample_usd"].map(is_number).any()) if len(cells) else False
    model, layers = cells[cells["target"] == "model"], cells[cells["target"] == "layer"]
    out = [("Whole model, time per sample" + (" and cost per 1M samples" if priced else ""),
            table(_table_rows(model, False, priced)) if len(model) else "(no whole-model cell in common)")]
    shown = _shown(layers, every_cell)
    hidden = layers.drop(shown.index)
    title = "Layers" + ("" if every_cell else ": the cells that changed")
    body = [table(_table_rows(shown, True, priced))] if len(shown) else []
    if len(hidden):
        said = "No layer cell changed beyond noise" if shown.empty else f"{len(hidden)} more layer cells not shown"
        body.append(lines([f"{said} ({_counts(hidden)}); --all shows every cell"]))
    out.append((title, "\n\n".join(body) or "(no layer cell in common)"))
    unjudged = layers[layers["verdict"].isin(UNJUDGED)]
    if len(unjudged) and not every_cell:
        out.append(("Cells without a verdict", lines([_counts(unjudged) + ": a median of 0 is below what the "
                    "harness resolves; a cell without raw samples or with fewer than 3 has nothing to test"])))
    matching = _matching(d)
    if matching:
        out.append(("Layers and cells only one side has", lines(matching)))
    if len(d.predicted):
        out.append(("Predicted cells (not measured: the change of two predictions, no verdict)",
                    table(_predicted_rows(d))))
    return out


def _text_table(rows: list[dict[str, str]]) -> str:
    return pd.DataFrame(rows).to_string(index=False)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def _md_table(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def render_text(d: Diff, every_cell: bool = False) -> str:
    lines = ["tbs diff", *_header(d), "", _gate_line(d)]
    for title, body in _sections(d, every_cell, _text_table, "\n".join):
        lines += ["", title, body]
    return "\n".join(lines)


def render_markdown(d: Diff, every_cell: bool = False) -> str:
    gate = _gate_line(d)
    lines = [f"### tbs diff: {d.new.model}", "", f"**{gate}**" if d.regressed else gate, ""]
    lines += [f"- {line}" for line in _header(d)]
    for title, body in _sections(d, every_cell, _md_table, lambda items: "\n".join(f"- {i}" for i in items)):
        lines += ["", f"#### {title}", "", body]
    return "\n".join(lines) + "\n"


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return _json.loads(frame.to_json(orient="records"))


def diff_dict(d: Diff) -> dict[str, Any]:
    """Everything the Diff holds, blank values as null."""
    side = (lambda s: {"directory": str(s.directory), "model": s.model, "mode": s.mode, "backend": s.backend,
                       "host": s.host, "started": s.started, "status": s.status})
    return {
        "base": side(d.base), "new": side(d.new), "threshold": d.threshold, "confidence": d.confidence,
        "gate": d.gate, "regressed": d.regressed, "regressions": len(d.regressions),
        "different_machines": d.different_machines, "notes": d.notes, "devices": d.devices,
        "batch_sizes": d.batch_sizes, "devices_only": d.devices_only, "batch_sizes_only": d.batch_sizes_only,
        "cells": _records(d.cells), "layers": _records(d.layers), "predicted": _records(d.predicted),
    }


def render(d: Diff, fmt: str = "text", every_cell: bool = False) -> str:
    if fmt == "json":
        return _json.dumps(diff_dict(d), indent=1)
    if fmt == "markdown":
        return render_markdown(d, every_cell)
    return render_text(d, every_cell)
