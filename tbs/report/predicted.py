"""The report's section on devices predicted, not measured (``tbs predict``).

A predicted number is only shown beside a measured one, hatched and labelled, never summed
or ranked with it; cells without a prediction are listed with the reason.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tbs.report.figures import DEVICE_COLORS
from tbs.predictions.gpu_predict import METHOD as GPU_METHOD
from tbs.predictions.whole import METHOD as WHOLE_METHOD, band_percent
from tbs.report.page import ReportData, esc, figure, table
from tbs.schema import MEASURED
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number

ACHIEVABLE_NAMES = {"flops": "FLOP/s", "bandwidth": "memory bandwidth"}
NOT_PREDICTED = "not predicted"  # how a prediction row without a time starts its reason


def numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers (NaN where blank or absent)."""
    return pd.to_numeric(frame[column], errors="coerce") if column in frame else pd.Series(float("nan"), frame.index)


# ----- 3. predicted devices ----------------------------------------------------------------------

def _bars(fig: go.Figure, rows: pd.DataFrame, name: str, color: str, col: int, predicted: bool) -> None:
    """One device's whole-model bars (per batch): time left, cost per 1M right; hatched when predicted."""
    rows = rows.sort_values("batch_size")
    per, batch = numbers(rows, "per_sample_s"), rows["batch_size"].astype(float)
    scale = 1.0 if col == 1 else numbers(rows, "cost_per_sample_usd") * PER_MILLION / per.where(per > 0)
    y, error = per * scale, None
    if predicted:
        high, low = (numbers(rows, f"{end}_s") / batch * scale for end in ("high", "low"))
        error = dict(type="data", array=list((high - y).fillna(0)), arrayminus=list((y - low).fillna(0)))
    hatch = dict(shape="/", fillmode="overlay", fgcolor="white", solidity=0.45) if predicted else None
    fig.add_bar(x=[f"batch {int(b)}" for b in rows["batch_size"]], y=list(y), name=name, legendgroup=name,
                showlegend=col == 1, error_y=error,
                marker=dict(color=color, line=dict(color=color, width=1.5), pattern=hatch),
                hovertemplate=f"<b>{name}</b> %{{x}}<br>%{{y:.3s}} {'s' if col == 1 else '$ per 1M samples'}"
                              + (f" (whisker: {band_percent(rows['method'])} band)" if predicted else "")
                              + "<extra></extra>", row=1, col=col)


def predicted_figure(data: ReportData, done: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> go.Figure:
    """The whole model per batch: measured devices solid, predicted devices hatched with their band."""
    model = data.model[data.model["status"].isin(MEASURED)] if len(data.model) else data.model
    whole = done[done["target"] == "model"]
    bars = [(model[model["device"] == d], f"{d} (measured)", data.view.color(d), False) for d in data.devices]
    no_host = {d for d in whole["device"] if "host billed apart" in _price(d, meta)}
    bars += [(whole[whole["device"] == d], f"{d} (predicted{', no host in price' if d in no_host else ''})",
              DEVICE_COLORS[(len(data.devices) + i) % len(DEVICE_COLORS)], True)
             for i, d in enumerate(dict.fromkeys(whole["device"]))]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=[
        "time per sample (log)", "cost per 1M samples (USD, log; priced devices only)"])
    for col in (1, 2):
        for rows, name, color, predicted in bars:
            rows = rows if col == 1 else rows[numbers(rows, "cost_per_sample_usd").notna()]
            if len(rows):
                _bars(fig, rows, name, color, col, predicted)
    fig.update_layout(barmode="group", title=f"Whole model: measured (solid) and predicted (hatched, whiskers = "
                      f"{band_percent(whole['method'])} band)", margin=dict(t=90, b=60), height=500,
                      legend=dict(orientation="h", y=-0.12, yanchor="top"))
    fig.update_yaxes(type="log", dtick=1)  # decades only: plotly's minor labels drop the unit
    fig.update_yaxes(tickformat="~s", ticksuffix="s", row=1, col=1)
    fig.update_yaxes(tickprefix="$", row=1, col=2)
    return fig


def _price(device: str, meta: Mapping[str, Any] | None) -> str:
    """Where the catalog's hourly price comes from, and whether it pays for the host too."""
    price = (((meta or {}).get("devices") or {}).get(device) or {}).get("price") or {}
    where = ", ".join(str(price[k]) for k in ("provider", "instance", "region", "date") if price.get(k))
    host = {"True": " (host included)", "False": " (accelerator only, host billed apart)"}
    return where + host.get(str(price.get("includes_host")), "")


def predicted_whole(done: pd.DataFrame, meta: Mapping[str, Any]) -> str:
    """The predicted whole model per device and batch: time with its band, price, cost; then the price sources."""
    whole = done[done["target"] == "model"].sort_values("batch_size", kind="stable")
    band = [f"{format_seconds(lo / b)} – {format_seconds(hi / b)}"
            for lo, hi, b in zip(whole["low_s"], whole["high_s"], whole["batch_size"])]
    frame = pd.DataFrame({
        "device": whole["device"], "batch": whole["batch_size"].astype(int), "from": whole["predicted_from"],
        "predicted time / sample": whole["per_sample_s"].map(format_seconds),
        f"{band_percent(whole['method'])} band": band,
        "$ / hour": whole["usd_per_hour"].map(format_usd), "priced as": [_price(d, meta) for d in whole["device"]],
        "cost / 1M samples": [f"${c * PER_MILLION:.3g}" if is_number(c) else "no price"
                              for c in whole["cost_per_sample_usd"]],
        "bound": [b if isinstance(b, str) else "" for b in whole["bound"]]})
    sources = dict(zip(whole["device"], whole["price_source"]))
    links = "".join(f"<li>{esc(d)}: {esc(u)}</li>" for d, u in sources.items() if isinstance(u, str))
    return (table(frame) if len(frame) else "") + (f'<ul class="note">Price sources: {links}</ul>' if links else "")


def predicted_layers(data: ReportData) -> str:
    """Layers x predicted devices at the largest batch, beside the measured device they were scaled from."""
    p = data.profile.predictions
    layers = p[p["target"] == "layer"]
    if layers.empty:
        return ""
    batch = int(layers["batch_size"].max())
    at = layers[layers["batch_size"] == batch]
    grid = pd.DataFrame(index=[l for l in data.layers if l in set(at["layer"])] or list(dict.fromkeys(at["layer"])))
    s = data.summary[(data.summary["batch_size"] == batch) & data.summary["status"].isin(MEASURED)]
    for device in dict.fromkeys(at["predicted_from"].dropna()):
        grid[f"{device} (measured)"] = s[s["device"] == device].set_index("layer")["per_sample_s"].map(format_seconds)
    for device in dict.fromkeys(at["device"]):
        cells = numbers(at[at["device"] == device].set_index("layer"), "per_sample_s").reindex(grid.index)
        grid[f"{device} (predicted)"] = [format_seconds(v) if is_number(v) else NOT_PREDICTED for v in cells]
        shares = numbers(at[at["device"] == device].set_index("layer"), "model_share").reindex(grid.index)
        if shares.notna().any():  # predicted from the whole compiled program: each layer's share of it
            grid[f"{device} share of model"] = [f"{v:.1%}" if is_number(v) else "-" for v in shares]
    grid.index = grid.index.map(data.view.label)
    return (f"<h3>Per layer at batch {batch}: time per sample, predicted beside measured</h3>"
            + table(grid.fillna("-").rename_axis("layer").reset_index()))


def not_predicted_list(missing: pd.DataFrame) -> str:
    """Each reason once, with the layers it kept from being predicted and where."""
    missing = missing.assign(reason=[r if isinstance(r, str) and r else NOT_PREDICTED for r in missing["reason"]])
    where = missing.groupby(["reason", "layer"], sort=False).agg(
        devices=("device", lambda d: ", ".join(dict.fromkeys(d))),
        batches=("batch_size", lambda b: ", ".join(str(int(x)) for x in sorted(set(b))))).reset_index()
    items = [f"<li>{esc(', '.join(g['layer']))} on {esc(devices)} at batch {esc(batches)}: <b>{esc(reason)}</b></li>"
             for (reason, devices, batches), g in where.groupby(["reason", "devices", "batches"], sort=False)]
    return f'<h3>Not predicted</h3><ul class="note">{"".join(items)}</ul>' if items else ""


def _methods(done: pd.DataFrame, meta: Mapping[str, Any]) -> str:
    """Each device's method once: the GPU model's family (its per-layer GEMMs are in the method column), or the
    roofline scaling with its settings."""
    names = meta.get("devices") or {}
    items = []
    for device, rows in done.groupby("device", sort=False):
        methods = [str(m) for m in rows["method"].dropna()]
        families = list(dict.fromkeys(c.strip() for m in methods
                                      for c in ([m.split(": ")[0]] if m.startswith((GPU_METHOD, WHOLE_METHOD))
                                                else m.split(";"))))
        items.append(f"<li><b>{esc(device)}</b> ({esc((names.get(device) or {}).get('name', 'catalog device'))}): "
                     f"{esc('; '.join(families))}</li>")
    return f"<ul>{''.join(items)}</ul>"


def section_predicted(data: ReportData) -> str:
    """Devices from the catalog that were not run: their predicted times, always apart from measured ones."""
    p = data.profile.predictions
    if p is None or p.empty:
        return ""
    reasons = pd.Series([r if isinstance(r, str) else "" for r in p["reason"]], index=p.index)
    missing = reasons.str.startswith(NOT_PREDICTED) | numbers(p, "median_s").isna()
    done, missing = p[~missing], p[missing]
    meta = data.profile.meta.prediction
    fractions = meta.get("achievable_fraction") or {}
    achievable = ", ".join(f"{float(v):.0%} of peak {ACHIEVABLE_NAMES.get(k, k)}"
                           for k, v in fractions.items() if is_number(v))
    banner = ('<div style="background:#fff4e5;border-left:4px solid #e65100;padding:8px 12px">'
              '<b>Predicted, not measured.</b> tbs did not run these devices. A GPU predicted from a CPU profile is '
              'priced by the GPU model fitted on published GPU measurements, from each layer\'s FLOPs, bytes and '
              'shapes (the GEMM and precision of every row are in predictions.csv\'s method); other devices scale '
              'the measured times to the catalog ceilings at an achievable fraction of their peak '
              f'({esc(achievable or "-")}, {esc(meta.get("achievable_source", "source not recorded"))}). '
              'Whiskers and bands are the 90% range (95% for a whole model predicted from its compiled program: '
              'published whole-model latencies spread wider). Measure on the device before committing to it; predicted '
              f'numbers are never summed or ranked with measured ones.{_methods(done, meta)}</div>')
    parts = ['<h2 id="predicted">Predicted devices (not measured)</h2>', banner]
    if len(done):
        parts += [figure(predicted_figure(data, done, meta)), predicted_whole(done, meta), predicted_layers(data)]
    return "\n".join(parts) + not_predicted_list(missing)
