"""The report's "why" sections: each cell against its device's roofline, and the compiler's FLOPs and
bytes before and after XLA (the paper's Fig. 2); then the devices predicted, not measured (predicted.py).

They only read the profile (``tbs.profiles.roofline`` and ``tbs.predict`` did the arithmetic). A predicted
number is only shown beside a measured one, hatched and labelled, never summed or ranked with it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from tbs.profiles.roofline import OVERHEAD_FRACTION, ceilings
from tbs.report.page import ReportData, esc, figure, table
from tbs.report.predicted import numbers
from tbs.schema import MEASURED
from tbs.units import format_bytes, format_seconds, is_number

BATCH_COLORS = qualitative.Dark2  # points coloured by batch size: unlike the device colours
BOUND_SYMBOLS = {"compute": "circle", "memory": "square", "overhead": "x"}
MAX_POINT_LABELS = 16  # past this, names on the points overlap: hover tells the layer
LABEL_DECADES = (0.25, 0.125)  # a point label's footprint (x, y, in decades of the log axes)
SI = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def si(value: object, unit: str) -> str:
    """961 MFLOP, 42.8 GB/s: counts and rates for people; blank where unknown (never 0 for a missing value)."""
    if not is_number(value):
        return ""
    number = float(value)  # type: ignore[arg-type]
    prefix, scale = next(((p, s) for p, s in SI if abs(number) >= s), ("", 1.0))
    return f"{number / scale:.3g} {prefix}{unit}"


# ----- 1. the roofline per measured device --------------------------------------------------------

def _ceiling_traces(fig: go.Figure, calibration: Mapping[str, Any] | None, x_range: tuple[float, float]) -> None:
    """The calibrated roofline: the bandwidth slope up to the ridge, then the flat matmul FLOP/s."""
    peak_flops, bandwidth = ceilings(calibration)
    lo, hi = x_range
    ridge = peak_flops / bandwidth if peak_flops and bandwidth else None
    if bandwidth:
        end = ridge or hi
        fig.add_scatter(x=[lo, end], y=[bandwidth * lo, bandwidth * end], mode="lines",
                        name=f"memory ceiling {si(bandwidth, 'B/s')}", line=dict(color="#333", width=2))
    if peak_flops:
        fig.add_scatter(x=[ridge or lo, hi], y=[peak_flops, peak_flops], mode="lines",
                        name=f"compute ceiling {si(peak_flops, 'FLOP/s')} (float32 matmul)",
                        line=dict(color="#333", width=2, dash="dash"))


def _hover(rows: pd.DataFrame, label: Callable[[str], str]) -> list[str]:
    """What a point is: the layer, its time, the compiler's counts, and how close it runs to the roof."""
    return [f"<b>{label(r['layer'])}</b>, batch {int(r['batch_size'])}<br>{format_seconds(r['median_s'])} per call"
            f"<br>{si(r['flops'], 'FLOP')}, {format_bytes(r['bytes_accessed'])} accessed"
            f"<br>{r['arithmetic_intensity']:.3g} FLOP/byte, {si(r['achieved_flops_per_s'], 'FLOP/s')}"
            + (f"<br>{r['fraction_of_roofline']:.2f} of the roofline: {r['bound']}"
               if is_number(r["fraction_of_roofline"]) else "<br>no ceilings: device not calibrated")
            for _, r in rows.iterrows()]


def _point_labels(rows: pd.DataFrame, label: Callable[[str], str]) -> list[str]:
    """Layer names for the points; a point within a label's footprint of an earlier labelled point adds its name
    to that label instead of overprinting it (a 10 px name spans about a quarter of a decade of the log x axis)."""
    out = [""] * len(rows)
    anchors: list[tuple[float, float, int]] = []  # (log x, log y, the row whose label it is)
    for i, (x, y, layer) in enumerate(zip(rows["arithmetic_intensity"], rows["achieved_flops_per_s"], rows["layer"])):
        lx, ly = math.log10(x), math.log10(y)
        near = next((a for a in anchors if abs(a[0] - lx) <= LABEL_DECADES[0] and abs(a[1] - ly) <= LABEL_DECADES[1]),
                    None)
        if near is None:
            anchors.append((lx, ly, i))
            out[i] = label(layer)
        else:
            out[near[2]] += ", " + label(layer)
    return out


def roofline_figure(cells: pd.DataFrame, whole: pd.DataFrame, device: str, batches: list[int],
                    calibration: Mapping[str, Any] | None, label: Callable[[str], str] = str) -> go.Figure:
    """Log-log: FLOP/byte against achieved FLOP/s, one point per layer cell (◆ the whole model), under the roof."""
    drawn = [f[f["arithmetic_intensity"].gt(0) & f["achieved_flops_per_s"].gt(0)] for f in (cells, whole)]
    peak_flops, bandwidth = ceilings(calibration)
    xs = [*drawn[0]["arithmetic_intensity"], *drawn[1]["arithmetic_intensity"]]
    xs += [peak_flops / bandwidth] if peak_flops and bandwidth else []
    fig = go.Figure()
    if xs:
        _ceiling_traces(fig, calibration, (min(xs) / 4, max(xs) * 4))
    for i, batch in enumerate(batches):
        color = BATCH_COLORS[i % len(BATCH_COLORS)]
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"batch {batch}", legendgroup=str(batch),
                        marker=dict(color=color, symbol="circle", size=10))  # the legend's swatch: colour = batch
        for rows, whole_model in ((drawn[0], False), (drawn[1], True)):
            rows = rows[rows["batch_size"] == batch]
            rows = rows.assign(layer="whole model") if whole_model else rows
            if rows.empty:
                continue
            labelled = not whole_model and batch == batches[-1] and len(rows) <= MAX_POINT_LABELS
            fig.add_scatter(x=list(rows["arithmetic_intensity"]), y=list(rows["achieved_flops_per_s"]),
                            mode="markers+text" if labelled else "markers", legendgroup=str(batch), showlegend=False,
                            text=_point_labels(rows, label) if labelled else None, textfont=dict(size=10),
                            textposition=[("top center", "bottom center")[k % 2] for k in range(len(rows))],
                            marker=dict(color=color, size=15 if whole_model else 10, line=dict(color="white", width=1),
                                        symbol=["diamond" if whole_model else BOUND_SYMBOLS.get(b, "circle-open")
                                                for b in rows["bound"]]),
                            hovertext=_hover(rows, label), hovertemplate="%{hovertext}<extra></extra>")
    for name, symbol in [*BOUND_SYMBOLS.items(), ("whole model", "diamond")]:  # the legend's shapes
        fig.add_scatter(x=[None], y=[None], mode="markers", name=name if name == "whole model" else f"{name}-bound",
                        marker=dict(color="#999", symbol=symbol, size=10))
    labels = f" (labels: batch {batches[-1]})" if batches else ""
    fig.update_layout(title=f"{device}: achieved FLOP/s against arithmetic intensity, under the calibrated roofline"
                            + labels,
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte accessed, log)"),
                      yaxis=dict(type="log", title="achieved FLOP/s (log)", tickformat="~s", ticksuffix="FLOP/s",
                                 dtick=1),
                      legend=dict(y=-0.2, yanchor="top"), margin=dict(b=110), height=540)
    return fig


def bound_table(summary: pd.DataFrame, label: Callable[[str], str] = str) -> pd.DataFrame:
    """Per device and batch, how many layers each limit binds and their share of the Σ of layer times."""
    cells = summary[summary["status"].isin(MEASURED)].assign(
        bound=lambda f: f["bound"].where(f["bound"].notna() & (f["bound"] != ""), "not analysed"),
        median_s=lambda f: numbers(f, "median_s"))
    rows = []
    for (device, batch), group in cells.groupby(["device", "batch_size"], sort=True):
        total = group["median_s"].sum()
        for bound in ("compute", "memory", "overhead", "not analysed"):
            part = group[group["bound"] == bound]
            if len(part):
                rows.append({"device": device, "batch": int(batch), "bound": bound, "layers": len(part),
                             "share of Σ layer time": f"{part['median_s'].sum() / total:.0%}" if total else "-",
                             "which": ", ".join(map(label, part["layer"]))})
    return pd.DataFrame(rows)


def section_roofline(data: ReportData) -> str:
    """Why a layer costs what it does: how close it runs to the device's compute or memory ceiling."""
    head = '<h2 id="roofline">Why it costs that: the roofline</h2>'
    s = data.summary
    if s.empty or numbers(s, "arithmetic_intensity").isna().all():
        return head + ('<p class="note">No compiler analysis (FLOPs, bytes) in this profile: profile it again '
                       'with this tbs to see where each layer stands against its device\'s ceilings.</p>')
    calibration = data.profile.meta.calibration
    parts = [head, '<p class="note">One point per measured layer cell: across, FLOPs per byte the compiler says '
             'it moves (an Embedding: the rows it reads, where the compiler counts its whole table); up, the FLOP/s '
             'it achieved. The lines are the ceilings measured on the device itself '
             '(a streaming copy and a float32 matmul). Fraction of roofline = the time the ceilings allow / the '
             f'measured time: under {OVERHEAD_FRACTION:g} neither FLOPs nor bytes explain the time (overhead: '
             'dispatch, latency). <b>Above 1 (a point over the line)</b> means the data stayed in cache (ran above '
             'DRAM bandwidth) or the compiler counted work the timed program fused away. Layers without counted '
             'FLOPs (pure data movement) are not drawn.</p>']
    for device in data.devices:
        cells = s[(s["device"] == device) & s["status"].isin(MEASURED)]
        whole = data.model[(data.model["device"] == device) & data.model["status"].isin(MEASURED)]
        parts.append(figure(roofline_figure(cells, whole, device, data.batches, calibration.get(device),
                                            data.view.label)))
        if not ceilings(calibration.get(device))[0]:
            parts.append(f'<p class="note">{esc(device)} has no calibration: its ceilings are not drawn.</p>')
    bounds = bound_table(s, data.view.label)
    return "\n".join(parts) + (f"<h3>What binds each layer</h3>{table(bounds)}" if len(bounds) else "")


# ----- 2. FLOPs and bytes before and after XLA ------------------------------------------------------

FIG2 = [("FLOPs before XLA", "flops_unoptimized", "FLOP"), ("FLOPs after", "flops", "FLOP"),
        ("bytes before XLA", "bytes_unoptimized", ""), ("bytes after", "bytes_accessed", ""),
        ("temp bytes", "temp_bytes", "")]


def _fig2_row(name: str, values: Mapping[str, object]) -> dict[str, str]:
    source = values.get("cost_source")
    return {"": name, **{title: (si(values.get(column), unit) if unit else format_bytes(values.get(column)))
                         for title, column, unit in FIG2}, "counted by": source if isinstance(source, str) else ""}


def analysis_device(data: ReportData) -> str | None:
    """The first measured device (metadata order) whose cells carry the compiler's analysis."""
    s = data.summary
    analysed = set(s[numbers(s, "bytes_accessed").notna()]["device"]) if len(s) else set()
    return next((d for d in [*data.profile.devices, *data.devices] if d in analysed), None)


def fig2_table(data: ReportData, device: str, batch: int) -> tuple[pd.DataFrame, str]:
    """The whole model, Σ layers, then each layer; and a line on what compiling it as one program saved."""
    s = data.summary
    cells = s[(s["device"] == device) & (s["batch_size"] == batch)].set_index("layer")
    cells = cells.reindex([l for l in data.layers if l in cells.index] + [l for l in cells.index
                                                                          if l not in data.layers])
    whole = data.model[(data.model["device"] == device) & (data.model["batch_size"] == batch)]
    sums: dict[str, object] = {c: numbers(cells, c).sum(min_count=1) for _, c, _ in FIG2}
    rows = ([_fig2_row("whole model (one program)", whole.iloc[0].to_dict())] if len(whole) else [])
    rows.append(_fig2_row("Σ layers (each compiled alone)", sums))
    rows += [_fig2_row(data.view.label(layer), r.to_dict()) for layer, r in cells.iterrows()]
    frame = pd.DataFrame(rows)
    sources = sorted(set(frame["counted by"]) - {""})
    frame = frame.drop(columns="counted by") if len(sources) <= 1 else frame  # one source: said once, below
    line = ""
    moved, alone = (whole.iloc[0].get("bytes_accessed") if len(whole) else None), sums["bytes_accessed"]
    if is_number(moved) and is_number(alone) and alone:
        line = (f"Batch {batch}: the whole model accesses {format_bytes(moved)} against {format_bytes(alone)} for "
                f"its layers compiled one by one: fusing across layers saves {1 - float(moved) / alone:.0%} of the "
                "bytes.")
    return frame, line + (f" Counted by {sources[0]}." if len(sources) == 1 else "")


def section_fig2(data: ReportData) -> str:
    """What the compiler counts, before and after its own optimisation, per layer and for the whole model."""
    head = '<h2 id="fig2">FLOPs and bytes, before and after XLA (the paper\'s Fig. 2)</h2>'
    device = analysis_device(data)
    if device is None:
        return head + '<p class="note">No compiler analysis in this profile: profile it again with this tbs.</p>'
    parts = [head, f'<p class="note">From the compiled programs on <b>{esc(device)}</b>: the analysis is per '
             'program, so one device shows it. "Before" is the program as traced, "after" once XLA has optimised '
             'and fused it; bytes are what the program reads and writes. Blank: not counted.</p>']
    for batch in data.batches:
        frame, line = fig2_table(data, device, batch)
        parts.append(f"<h3>Batch {batch}</h3><p>{esc(line)}</p>{table(frame)}")
    return "\n".join(parts)
