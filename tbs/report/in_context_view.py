"""The report's in-context view: each layer timed alone beside its share of the traced whole-model call.

Drawn from the in-model columns a profile derives from its ops.csv (tbs.measure.in_context): nothing
is traced or attributed again here. A layer's in-model bar is split into the time of kernels it runs
alone and its part of kernels it shares with other layers (fusion), so a shared kernel is never
shown as one layer's.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from tbs.report.page import ReportData, esc, figure, table
from tbs.units import format_seconds, is_number

ISOLATED, OWN, SHARED = "#1f77b4", "#2ca02c", "#98df8a"


def has_in_context(data: ReportData) -> bool:
    summary = data.profile.summary
    return "in_model_s" in summary and summary["in_model_s"].map(is_number).any()


def _cells(data: ReportData) -> list[tuple[str, int, pd.DataFrame, pd.Series]]:
    """Each (device, batch) traced in context: its layer rows (model order) and its model row."""
    summary, model = data.profile.summary, data.profile.model
    out = []
    for (device, batch), rows in summary[summary["in_model_s"].map(is_number)].groupby(["device", "batch_size"]):
        whole = model[(model["device"] == device) & (model["batch_size"] == batch)]
        if whole.empty or not is_number(whole.iloc[0].get("in_model_s")):
            continue
        order = {name: i for i, name in enumerate(data.layers)}
        rows = rows.assign(_order=rows["layer"].map(order)).sort_values("_order")
        out.append((str(device), int(batch), rows, whole.iloc[0]))
    return out


def _shown(rows: pd.DataFrame, top: int | None) -> pd.DataFrame:
    """The ``top`` layers heaviest alone or in the model (model order); all when few."""
    if top is None or len(rows) <= top:
        return rows
    weight = pd.concat([pd.to_numeric(rows["median_s"], errors="coerce"),
                        pd.to_numeric(rows["in_model_s"], errors="coerce")], axis=1).max(axis=1)
    return rows.loc[weight.nlargest(top).index].sort_values("_order")


def bars(rows: pd.DataFrame, title: str) -> go.Figure:
    """Per layer: isolated median beside in-model time (its own kernels, then its part of shared ones), per call."""
    layers = list(rows["layer"])
    isolated = pd.to_numeric(rows["median_s"], errors="coerce") * 1e3
    in_model = pd.to_numeric(rows["in_model_s"], errors="coerce") * 1e3
    shared = pd.to_numeric(rows["in_model_shared_s"], errors="coerce").fillna(0.0) * 1e3
    own = (in_model - shared).clip(lower=0.0)
    fig = go.Figure()
    fig.add_bar(name="isolated (median, timed alone)", x=layers, y=list(isolated), marker_color=ISOLATED,
                offsetgroup="isolated")
    fig.add_bar(name="in model: own kernels", x=layers, y=list(own), marker_color=OWN, offsetgroup="in model")
    fig.add_bar(name="in model: share of kernels fused with other layers", x=layers, y=list(shared), base=list(own),
                marker_color=SHARED, offsetgroup="in model", customdata=list(rows["in_model_note"].fillna("")),
                hovertemplate="%{x}: %{y:.3g} ms shared<br>%{customdata}<extra></extra>")
    fig.update_layout(title=title, barmode="group", yaxis_title="ms per call", xaxis_tickangle=-45)
    return fig


def _table(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "layer": rows["layer"],
        "isolated / call": rows["median_s"].map(format_seconds),
        "in model / call": rows["in_model_s"].map(format_seconds),
        "of it shared": rows["in_model_shared_s"].map(lambda v: format_seconds(v) if is_number(v) and v else ""),
        "share of the call": rows["model_share"].map(lambda v: f"{v:.1%}" if is_number(v) else ""),
        "why they differ": rows["in_model_note"].fillna(""),
    })


def section_in_context(data: ReportData) -> str:
    """Each traced (device, batch): the bars, the framework's own time, and a table with the reasons."""
    parts = []
    for device, batch, rows, whole in _cells(data):
        unowned = whole.get("unowned_s")
        shown = _shown(rows, data.top)
        fold = f" (the {len(shown)} heaviest of {len(rows)} layers)" if len(shown) < len(rows) else ""
        parts.append(
            f"<h3>{esc(device)} @ batch {batch}</h3>"
            f"<p>One traced call {format_seconds(whole['in_model_s'])} = Σ layers in model "
            f"{format_seconds(whole['in_model_s'] - (unowned if is_number(unowned) else 0.0))} + the framework's own "
            f"{format_seconds(unowned)} (no layer's op runs then: scheduling, waiting, ops naming no layer); "
            f"mean of {int(whole['traced_calls'])} calls. The whole model timed the usual way: "
            f"{format_seconds(whole.get('median_s'))} per call.</p>"
            + figure(bars(shown, f"{device} @ batch {batch}: isolated and in model, per call{fold}"))
            + table(_table(rows)))
    return ('<h2 id="in-context">In context</h2><p class="note">Each layer timed alone (its isolated median) beside '
            "its share of a few whole-model calls traced with the framework's own profiler after the timed samples: "
            "each op's time goes to the Keras layer whose name scope it carries; a kernel fused from several layers' "
            "ops is split between them by their work in it (the lighter green part), never given to one. The "
            "difference says what a layer costs inside the compiled model: fused into a neighbour, overlapped, or "
            "cheaper in context.</p>" + "".join(parts))
