"""The report's per-layer figures, built from the profile's rows (plotly figures, no HTML).

Three views of the same cells: the linear stacked bars (where the time and the money
go, whole model beside the sum of its layers), the heatmap of each layer against its
best device, and the log-axis spread of every layer. Kept apart from the page so a
test can read a figure's numbers back; nothing here measures or solves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from tbs.report.vocabulary import INACTIVE_MARK, NOT_IN_STEP_MARK
from tbs.schema import USABLE
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number

MAX_LEGEND_LAYERS = 20  # past this a legend is a wall of names: hover tells the layer instead
# Ratio to the best device -> colour: 1.0 is its own green, then pale to dark red (log-like steps).
RATIO_CAP = 5.0  # beyond 5x the colour saturates; the cell's text still gives the ratio
RATIO_STOPS = [(1.0, "#1a9850"), (1.02, "#d9ef8b"), (1.25, "#fee08b"), (2.0, "#fdae61"), (3.0, "#f46d43"),
               (RATIO_CAP, "#a50026")]
DEVICE_COLORS = qualitative.Plotly  # a device keeps its colour in every figure
LAYER_COLORS = qualitative.Set2 + qualitative.Pastel1  # stacked segments: unlike the device colours


@dataclass(frozen=True)
class View:
    """What every per-layer figure shares: the layer order and which layers are inactive in which mode."""

    layers: list[str]
    mode: str = "inference"
    inactive: set[str] = field(default_factory=set)
    devices: list[str] = field(default_factory=list)
    not_in_step: set[str] = field(default_factory=set)  # rows the compiled train step never runs: never stacked

    @property
    def summed(self) -> list[str]:
        """The layers whose times add up to the whole (model or train step)."""
        return [layer for layer in self.layers if layer not in self.not_in_step]

    @property
    def whole_name(self) -> str:
        """What the ◆ measured: one compiled forward pass, or one compiled train step."""
        return "whole train step" if self.mode == "training" else "whole model"

    def color(self, device: str) -> str:
        """The device's colour, the same in every figure (by its place among all the profile's devices)."""
        index = self.devices.index(device) if device in self.devices else len(self.devices)
        return DEVICE_COLORS[index % len(DEVICE_COLORS)]

    def label(self, layer: str) -> str:
        mark = INACTIVE_MARK if layer in self.inactive else NOT_IN_STEP_MARK if layer in self.not_in_step else ""
        return f"{layer}\u00a0{mark}" if mark else layer  # the mark stays on its line

    def note(self, layer: str) -> str:
        """A hover line for an inactive layer, or one the train step never runs (empty otherwise)."""
        if layer in self.not_in_step:
            return f"<br>{NOT_IN_STEP_MARK} not run by the compiled train step: not summed"
        if layer not in self.inactive:
            return ""
        return f"<br>{INACTIVE_MARK} inactive in {self.mode}: passes its input through"


def _value(objective: str) -> str:
    return "per_sample_s" if objective == "time" else "cost_per_sample_usd"


def _scale(objective: str) -> float:
    """Cost is drawn per 1M samples: a dollar amount people can read; time stays in seconds."""
    return 1.0 if objective == "time" else float(PER_MILLION)


def fmt(value: float | None, objective: str) -> str:
    """A per-sample time, or a per-sample cost shown per 1M samples."""
    if not is_number(value):
        return "-"
    return format_seconds(value) if objective == "time" else f"{format_usd(value * PER_MILLION)} / 1M"


def _none(value: float) -> float | None:
    """NaN as None, so plotly leaves a gap (a missing cell is not 0)."""
    return float(value) if is_number(value) else None


def layer_stack(summary: pd.DataFrame, view: View, devices: list[str], batch: int, objective: str) -> pd.DataFrame:
    """Layers (model order) x devices: the median per sample of measured cells; NaN where none."""
    column = _value(objective)
    cells = summary[(summary["batch_size"] == batch) & summary["status"].isin(USABLE) & summary[column].notna()]
    table = cells.pivot_table(index="layer", columns="device", values=column, aggfunc="first")
    return table.reindex(index=view.layers, columns=devices).astype(float)


def whole_model(model: pd.DataFrame, batch: int, objective: str) -> dict[str, float]:
    """Per device, the whole model's measured (compiled) time or cost per sample at this batch."""
    column = _value(objective)
    if model.empty:
        return {}
    rows = model[(model["batch_size"] == batch) & model["status"].isin(USABLE) & model[column].notna()]
    return {str(r["device"]): float(r[column]) for _, r in rows.iterrows()}


def missing_cells(summary: pd.DataFrame, stack: pd.DataFrame, batch: int) -> dict[str, list[str]]:
    """Per device, the layers left out of its sum, with their status (oom, error, ...)."""
    at = summary[summary["batch_size"] == batch].set_index(["layer", "device"])["status"]
    found: dict[str, list[str]] = {}
    for device in stack.columns:
        gaps = stack.index[stack[device].isna()]
        found[device] = [f"{layer} ({at.get((layer, device), 'not run')})" for layer in gaps]
    return found


def _device_label(device: str, total: float, whole: float | None, missing: list[str], layers: int,
                  objective: str, whole_name: str = "model") -> str:
    """Tick text: the device, Σ layers and the whole model, and how many layers the Σ covers."""
    text = f"<b>{device}</b><br>Σ layers {fmt(total, objective)}  ◆ {whole_name} {fmt(whole, objective)}"
    if missing:
        text += f"<br>only {layers - len(missing)} of {layers} layers measured"
    return text


FOLD_COLOR = "#c7c7c7"  # the folded rest of the layers: grey, unlike every layer colour


def stacked_figure(stack: pd.DataFrame, whole: dict[str, float], missing: dict[str, list[str]], view: View,
                   batch: int, objective: str, folded: str | None = None) -> go.Figure:
    """One horizontal bar per device, its layers stacked in model order; ◆ the whole model.

    ``folded`` names the stack's last row when it is the rest of the layers summed (drawn grey).
    """
    scale, totals = _scale(objective), stack.sum(axis=0, min_count=1)
    short = "step" if view.mode == "training" else "model"
    labels = [_device_label(d, totals[d], whole.get(d), missing.get(d, []), len(stack.index), objective, short)
              for d in stack.columns]
    fig = go.Figure()
    for i, layer in enumerate(stack.index):
        values = stack.loc[layer]
        share = [v / totals[d] if totals[d] else math.nan for d, v in values.items()]
        fig.add_bar(orientation="h", name=view.label(layer), y=labels, x=[_none(v * scale) for v in values],
                    marker=dict(color=FOLD_COLOR if layer == folded else LAYER_COLORS[i % len(LAYER_COLORS)],
                                line=dict(color="white", width=0.5)),
                    customdata=[[d, fmt(v, objective), f"{s:.1%}", view.note(layer)]
                                for (d, v), s in zip(values.items(), share)],
                    hovertemplate=f"<b>{view.label(layer)}</b> on %{{customdata[0]}}, batch {batch}<br>"
                                  "%{customdata[1]} per sample, %{customdata[2]} of Σ layers"
                                  "%{customdata[3]}<extra></extra>")
    gaps = [f"{d}: {len(m)} layer(s) not measured, left out of Σ ({', '.join(m[:4])}{', …' if len(m) > 4 else ''})"
            for d, m in missing.items() if m]
    fig.add_scatter(y=labels, x=[_none(whole.get(d, math.nan) * scale) for d in stack.columns], mode="markers",
                    name=f"{view.whole_name} (compiled)", marker=dict(symbol="diamond", size=14, color="#111",
                                                                 line=dict(color="white", width=1.5)),
                    customdata=[[d, fmt(whole.get(d), objective), fmt(totals[d], objective)] for d in stack.columns],
                    hovertemplate=f"<b>{view.whole_name}</b> on %{{customdata[0]}}: %{{customdata[1]}} per sample"
                                  "<br>Σ layers: %{customdata[2]}<extra></extra>")
    what = "time per sample" if objective == "time" else "cost per 1M samples"
    stacked = (f"the {len(stack.index) - 1} heaviest layers stacked in model order, then the rest" if folded
               else "layers stacked in model order")
    title = f"Batch {batch}: {what}, {stacked} (◆ = {view.whole_name})"
    legend = len(stack.index) <= MAX_LEGEND_LAYERS + (1 if folded else 0)  # the fold is one more entry
    if not legend:
        title += ": hover a segment for its layer"
    fig.update_layout(barmode="stack", title=title + ("<br><sup>" + "; ".join(gaps) + "</sup>" if gaps else ""),
                      height=max(170 + 80 * len(labels), 120 + 19 * (len(stack.index) + 1)),
                      showlegend=legend,
                      legend=dict(orientation="v", x=1.01, y=1, traceorder="normal", font=dict(size=11)),
                      yaxis=dict(autorange="reversed", automargin=True),
                      xaxis=dict(title=what + " (linear)", rangemode="tozero",
                                 **({"tickformat": "~s", "ticksuffix": "s"} if objective == "time"
                                    else {"tickprefix": "$"})))
    return fig


def relative_to_best(stack: pd.DataFrame) -> pd.DataFrame:
    """Each cell over the best (lowest) device of its layer: 1.0 = best, 3.0 = 3x; NaN stays NaN.

    A best of 0 s (below the timer's resolution) has no ratio: its zeros are 1.0, the rest NaN.
    """
    best = stack.min(axis=1)
    ratio = stack.div(best.where(best > 0), axis=0)
    return ratio.mask(stack.eq(0) & best.eq(0).to_numpy()[:, None], 1.0)


def _colorscale() -> list[list[object]]:
    return [[(ratio - 1.0) / (RATIO_CAP - 1.0), color] for ratio, color in RATIO_STOPS]


def heatmap_trace(stack: pd.DataFrame, view: View, batch: int, objective: str) -> go.Heatmap:
    """Layers x devices, coloured by the ratio to the layer's best device; null (blank) where not measured."""
    ratio = relative_to_best(stack)
    best = {layer: row.idxmin() for layer, row in stack.iterrows() if row.notna().any()}
    z, text, hover = [], [], []
    for layer in stack.index:
        z.append([_none(r) for r in ratio.loc[layer]])
        text.append(["" if not is_number(r) else ("best" if r == 1.0 else f"{r:.1f}×") for r in ratio.loc[layer]])
        hover.append([f"<b>{view.label(layer)}</b> on {d}, batch {batch}<br>{fmt(v, objective)} per sample<br>"
                      + (("not measured" if not is_number(v) else "no ratio: the best measured 0 s") if not is_number(r) else
                         "best device for this layer" if r == 1.0 else f"{r:.2f}× the best ({best.get(layer)})")
                      + view.note(layer) for d, v, r in zip(stack.columns, stack.loc[layer], ratio.loc[layer])])
    return go.Heatmap(z=z, x=list(stack.columns), y=[view.label(layer) for layer in stack.index], text=text,
                      hovertext=hover, texttemplate="%{text}", hovertemplate="%{hovertext}<extra></extra>",
                      hoverongaps=True, xgap=2, ygap=2, coloraxis="coloraxis", name=objective)


def heatmap_figure(stacks: dict[str, pd.DataFrame], view: View, batch: int) -> go.Figure:
    """Time (and cost) heatmaps of one batch side by side: one layer axis, one colour scale."""
    widths = [max(1, len(stack.columns)) for stack in stacks.values()]
    fig = make_subplots(rows=1, cols=len(stacks), shared_yaxes=True, horizontal_spacing=0.04,
                        column_widths=[w / sum(widths) for w in widths],
                        subplot_titles=[f"{what} per sample" + (" (priced devices)" if what == "cost" else "")
                                        for what in stacks])
    for col, (objective, stack) in enumerate(stacks.items(), start=1):
        fig.add_trace(heatmap_trace(stack, view, batch, objective), row=1, col=col)
    ticks = [1, 2, 3, 4, RATIO_CAP]
    fig.update_layout(title=f"Batch {batch}: each layer against its best device (1 = best)",
                      height=max(360, 170 + 26 * len(view.layers)), plot_bgcolor="#e8e8e8",
                      margin=dict(t=110), coloraxis=dict(
                          cmin=1.0, cmax=RATIO_CAP, colorscale=_colorscale(),
                          colorbar=dict(title=dict(text="× best", side="top"), ypad=20, tickvals=ticks,
                                        ticktext=["1 best", "2×", "3×", "4×", f"≥{RATIO_CAP:g}×"])))
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(side="top", showgrid=False)
    fig.update_annotations(yshift=28)  # subplot titles above the device names
    return fig


def _zero_marks(fig: go.Figure, cells: pd.DataFrame, view: View, column: str) -> None:
    """A log axis cannot draw 0: mark the layers measured at 0 instead of leaving a silent gap."""
    zero = cells[cells[column] == 0]
    positive = cells[column][cells[column] > 0]
    if zero.empty or positive.empty:
        return
    layers = [layer for layer in view.layers if layer in set(zero["layer"])]
    where = [", ".join(sorted(zero[zero["layer"] == layer]["device"])) for layer in layers]
    fig.add_scatter(x=[view.label(layer) for layer in layers], y=[positive.min() / 2] * len(layers),
                    mode="markers+text", text=["0"] * len(layers), textposition="top center",
                    marker=dict(symbol="line-ew-open", size=14, color="#555"), name="0 (too fast to resolve)",
                    customdata=[[w, view.note(layer)] for w, layer in zip(where, layers)],
                    hovertemplate="<b>%{x}</b>: 0 s on %{customdata[0]}<br>too fast to resolve once the harness "
                                  "overhead is subtracted;<br>a log axis cannot draw 0%{customdata[1]}<extra></extra>")


def spread_figure(summary: pd.DataFrame, view: View, devices: list[str], batch: int, objective: str) -> go.Figure:
    """Per layer, grouped bars per device on a log axis: the spread over orders of magnitude, 25–75% whiskers."""
    s = summary[(summary["batch_size"] == batch) & summary["status"].isin(USABLE)]
    column = _value(objective)
    fig = go.Figure()
    for device in devices:
        rows = s[s["device"] == device].set_index("layer").reindex(view.layers).dropna(subset=[column])
        scale = rows[column] / rows["median_s"].where(rows["median_s"] > 0)
        err_plus = (rows["p75_s"] * scale - rows[column]).clip(lower=0)
        err_minus = (rows[column] - rows["p25_s"] * scale).clip(lower=0)
        fig.add_bar(
            name=device, x=[view.label(layer) for layer in rows.index], y=list(rows[column]),
            marker_color=view.color(device),
            error_y=dict(type="data", array=list(err_plus.fillna(0)), arrayminus=list(err_minus.fillna(0))),
            customdata=list(zip(rows["p25_s"] / batch, rows["p75_s"] / batch, rows["n"], rows["status"],
                                rows["cost_per_sample_usd"], [view.note(layer) for layer in rows.index])),
            hovertemplate=(f"<b>%{{x}}</b><br>{device}, batch {batch}<br>median %{{y:.3s}}"
                           + (" s" if objective == "time" else " USD")
                           + "<br>IQR %{customdata[0]:.3s}–%{customdata[1]:.3s} s/sample<br>n=%{customdata[2]}"
                           "  %{customdata[3]}<br>cost/sample %{customdata[4]:.3s} USD%{customdata[5]}"
                           "<extra></extra>"),
        )
    _zero_marks(fig, s[s["device"].isin(devices)], view, column)
    title = "time per sample (s, log)" if objective == "time" else "cost per sample (USD, log)"
    fig.update_layout(barmode="group", title=f"Batch {batch}: {title}, bars = median, whiskers = 25–75%",
                      yaxis=dict(type="log", title=title), xaxis=dict(tickangle=-45))
    return fig


def _scaling_traces(fig: go.Figure, s: pd.DataFrame, view: View, devices: list[str], shown: str) -> list[int]:
    """Median line and 25–75% band per device for every layer; returns the trace count per layer."""
    counts = []
    for layer in view.layers:
        count = 0
        for device in devices:
            rows = s[(s["layer"] == layer) & (s["device"] == device)].sort_values("batch_size")
            if rows.empty:
                continue
            color, visible, x = view.color(device), layer == shown, list(rows["batch_size"])
            fig.add_scatter(x=x + x[::-1], y=list(rows["p75_s"] / rows["batch_size"])
                            + list((rows["p25_s"] / rows["batch_size"])[::-1]),
                            fill="toself", fillcolor=color, opacity=0.2, line=dict(width=0), hoverinfo="skip",
                            showlegend=False, visible=visible, name=f"{device} 25–75%")
            fig.add_scatter(x=x, y=list(rows["per_sample_s"]), mode="lines+markers", name=device,
                            line=dict(color=color), visible=visible,
                            customdata=list(zip(rows["n"], rows["status"])),
                            hovertemplate=f"{view.label(layer)}<br>{device}, batch %{{x}}<br>median %{{y:.3s}} "
                                          "s/sample<br>n=%{customdata[0]} %{customdata[1]}"
                                          f"{view.note(layer)}<extra></extra>")
            count += 2
        counts.append(count)
    return counts


def scaling_figure(summary: pd.DataFrame, view: View, devices: list[str]) -> go.Figure:
    """Time per sample against batch size, one layer at a time (a picker), the heaviest layer first."""
    s = summary[summary["status"].isin(USABLE)]
    heaviest = s.groupby("layer")["per_sample_s"].max().reindex(view.layers).fillna(0).idxmax()
    fig = go.Figure()
    counts = _scaling_traces(fig, s, view, devices, heaviest)
    buttons, start, total = [], 0, sum(counts)
    for layer, count in zip(view.layers, counts):
        visible = [False] * total
        visible[start:start + count] = [True] * count
        buttons.append(dict(label=view.label(layer), method="update",
                            args=[{"visible": visible}, {"title": f"{view.label(layer)}: time per sample"}]))
        start += count
    fig.update_layout(title=f"{view.label(heaviest)}: time per sample (pick a layer on the right)",
                      xaxis=batch_axis(sorted({int(b) for b in summary["batch_size"].dropna()})),
                      yaxis=dict(type="log", title="seconds per sample (median, 25–75% band)"),
                      updatemenus=[dict(buttons=buttons, x=1.0, xanchor="right", y=1.18, yanchor="top",
                                        active=view.layers.index(heaviest))])
    return fig


def batch_axis(batches: list[int]) -> dict:
    """A log batch-size axis labelled at the measured batch sizes only."""
    return dict(type="log", title="batch size", tickvals=list(batches), ticktext=[str(b) for b in batches])


# The same in every figure, and darker than every device and layer colour, so a phase is never read as one.
PHASE_COLORS = {"forward": "#1f3b73", "backward": "#a63603", "update": "#006d2c"}


def phase_figure(phases: pd.DataFrame, view: View, devices: list[str], batch: int) -> go.Figure:
    """Per layer and device, forward, backward and update stacked (time per sample, linear axis).

    One trace per phase, so a phase keeps its colour everywhere; the x axis groups the
    devices under each layer. A failed phase is left out (a gap, never 0) and named in the hover.
    """
    at = phases[(phases["batch_size"] == batch) & phases["device"].isin(devices)]
    pairs = [(layer, d) for layer in view.layers for d in devices
             if not at[(at["layer"] == layer) & (at["device"] == d)].empty]
    values = at.set_index(["layer", "device", "phase"])["seconds_per_sample"]
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        ys = [values.get((layer, d, phase)) for layer, d in pairs]
        hover = []
        for (layer, d), y in zip(pairs, ys):
            known = [values.get((layer, d, p)) for p in PHASE_COLORS]
            total = sum(v for v in known if is_number(v))
            missing = [p for p, v in zip(PHASE_COLORS, known) if not is_number(v)]
            share = f"{y / total:.0%} of its step" if is_number(y) and total else ""
            hover.append(f"<b>{view.label(layer)}</b> on {d}, batch {batch}<br>{phase}: "
                         + (f"{format_seconds(y)} per sample, {share}" if is_number(y) else "not measured (failed)")
                         + (f"<br>missing: {', '.join(missing)}" if missing else ""))
        labels = [view.label(l) for l, _ in pairs]
        one_device = len({d for _, d in pairs}) == 1  # a plain axis: long layer names rotate instead of overlapping
        fig.add_bar(name=phase, x=labels if one_device else [labels, [d for _, d in pairs]],
                    y=[_none(y) if is_number(y) else None for y in ys], marker_color=color,
                    hovertext=hover, hovertemplate="%{hovertext}<extra></extra>")
    seconds_axis = dict(title="seconds per sample (linear)", tickformat="~s", ticksuffix="s", rangemode="tozero")
    share_axis = dict(title="share of the layer's train step (%)", tickformat="", ticksuffix="%", rangemode="tozero")
    switch = [dict(label=label, method="relayout", args=[{"barnorm": norm, "yaxis": axis}])
              for label, norm, axis in (("seconds", "", seconds_axis), ("% of each bar", "percent", share_axis))]
    fig.update_layout(barmode="stack", title=f"Batch {batch}: each layer's train step per sample, by phase "
                      "(devices side by side under each layer)", yaxis=seconds_axis,
                      xaxis=dict(tickangle=-45), legend=dict(traceorder="normal"),
                      updatemenus=[dict(type="buttons", direction="right", buttons=switch, x=1.0, xanchor="right",
                                        y=1.03, yanchor="bottom", showactive=True, active=0, pad=dict(b=2))])
    return fig
