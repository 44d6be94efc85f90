"""The HTML report: one self-contained page (plotly.js inlined), built from a Profile.

Sections are functions from the report's data to HTML, listed once in REGISTRY with their
anchor, nav title and when they apply; adding one is a renderer and one line there.
Nothing here measures anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from tbs.place.result import Recommendation
from tbs.profiles.profile import Profile
from tbs.report import roofline, training_view as training
from tbs.report.in_context_view import has_in_context, section_in_context
from tbs.report.memory import section_memory
from tbs.report.predicted import section_predicted
from tbs.report.records import section_cells, section_environment, section_not_measured
from tbs.report.winners import crossovers, winner, winners
from tbs.report.vocabulary import (INACTIVE_MARK, NOT_IN_STEP_MARK, NOT_IN_STEP_MEANING, comparison_table,
                                   inactive_layers, not_in_step, saving_line, training_command)
from tbs.report.figures import batch_axis, heatmap_figure, layer_stack, scaling_figure, spread_figure
from tbs.report.groups import DEFAULT_TOP
from tbs.report.layers_view import section_layer_table, section_where as where_figures
from tbs.report.page import ReportData, esc as _esc, figure as _figure, table as _table
from tbs.schema import MEASURED, USABLE
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number

def _inactive_note(data: ReportData) -> str:
    """The one explanation of the † mark, naming the layers (nothing when none is inactive)."""
    names = inactive_layers(data.profile)
    if not names:
        return ""
    command = training_command(data.profile)
    return (f'<p class="note inactive"><b>{INACTIVE_MARK} {_esc(", ".join(names))}</b>: inactive in '
            f'{_esc(data.profile.mode)}. These layers pass their input through unchanged in this mode (Dropout, '
            'random augmentation), so their time is call overhead only.'
            + (f' To see what they cost in training: <code>{_esc(command)}</code>' if command else "") + '</p>')


# ----- sections ---------------------------------------------------------------------------------

def section_summary(data: ReportData) -> str:
    meta = data.profile.meta
    model = data.model
    lines = []
    sums, ratio = (("Σ layers + loss / sample", "Σ / whole step") if data.training
                   else ("Σ layers / sample", "Σ layers / whole"))
    esc_adds_up = ("Σ / whole step near 1 means the layers' train steps and the loss add up to the compiled train "
                   "step." if data.training else
                   "Σ layers / whole near 1 means the per-layer numbers add up to the compiled model.")
    for batch in data.batches:
        rows = model[model["batch_size"] == batch] if len(model) else model
        for _, r in rows.iterrows():
            cost = r.get("cost_per_sample_usd")
            workload = (format_usd(cost * data.dataset_size) if is_number(cost) and data.dataset_size else "")
            lines.append({
                "batch": batch, "device": r["device"], "status": r["status"],
                "time / sample": format_seconds(r.get("per_sample_s")),
                "cost / sample": format_usd(cost) if is_number(cost) else "no price",
                "cost / 1M samples": format_usd(cost * PER_MILLION) if is_number(cost) else "no price",
                **({f"cost of {data.dataset_size:,} samples": workload} if data.dataset_size else {}),
                sums: format_seconds(r.get("layers_sum_per_sample_s")),
                ratio: (f"{r['layers_sum_s'] / r['median_s']:.2f}" if is_number(r.get("layers_sum_s"))
                        and is_number(r.get("median_s")) and r["median_s"] else "-"),
            })
    best = []
    for batch in data.batches:
        rows = model[model["batch_size"] == batch].assign(layer="(model)") if len(model) else model
        if rows.empty:
            continue
        fast, cheap = winner(rows, "time"), winner(rows, "cost")
        best.append(f"<li>batch {batch}: fastest single device <b>{_esc(fast['label'])}</b>; "
                    f"cheapest <b>{_esc(cheap['label'] if data.priced_devices else 'no prices given')}</b></li>")
    devices = "".join(f"<li><b>{_esc(d.get('name'))}</b> ({_esc(d.get('kind'))}): {_esc(d.get('description'))}</li>"
                      for d in meta.devices)
    return f"""
<h2 id="summary">Summary</h2>
<p>Model <b>{_esc(meta.model.get('name'))}</b> ({_esc(meta.model.get('class'))},
{len(data.layers)} layers, {_esc(meta.model.get('params'))} parameters), {_esc(meta.mode)} mode,
batch sizes {', '.join(map(str, data.batches))}.</p>
<ul>{devices}</ul>
<ul>{''.join(best)}</ul>
{_table(pd.DataFrame(lines), 'status') if lines else '<p>No whole-model measurement.</p>'}
<p class="note">Winners are declared only where confidence intervals do not overlap; otherwise the report says tie.
{esc_adds_up}</p>"""


def section_where(data: ReportData) -> str:
    """The heaviest layers stacked per batch (the rest folded), by kind and by block; what the marks mean."""
    return where_figures(data) + _inactive_note(data) + _not_in_step_note(data)


def _heaviest_note(data: ReportData, shown: int) -> str:
    """Says when a figure draws only the heaviest layers, and where every layer is."""
    if shown >= len(data.layers):
        return ""
    return (f'<p class="note">The {shown} heaviest layers (by time) of {len(data.layers)}, in model order; every '
            'layer is in <a href="#every-layer">the table</a> (<code>tbs report DIR -o FILE --all</code> draws '
            'them all).</p>')


def _not_in_step_note(data: ReportData) -> str:
    """The ‡ mark: rows the compiled train step never runs, left out of the bars and of Σ."""
    names = not_in_step(data.profile)
    if not names:
        return ""
    return (f'<p class="note"><b>{NOT_IN_STEP_MARK} {_esc(", ".join(names))}</b>: {_esc(NOT_IN_STEP_MEANING)} '
            '(and out of these bars).</p>')


def section_relative(data: ReportData) -> str:
    """Layers x devices heatmaps: how far each device is from the best one for that layer."""
    view, parts = data.view, ['<h2 id="relative">Each layer against its best device</h2>']
    parts.append('<p class="note">1.0 (green) is the best device for the layer at that batch size; 3.0 is three '
                 'times slower (or, among priced devices, dearer). Grey: not measured. The hover gives the absolute '
                 'value. Close ratios may be noise: see <a href="#winners">Best device per layer</a> for ties.</p>')
    if len(data.devices) < 2:
        return parts[0] + '<p class="note">One device profiled: nothing to compare. Profile two or more.</p>'
    for batch in data.batches:
        view = replace(data.view, layers=data.heaviest(batch))
        parts += [_heaviest_note(data, len(view.layers))] if len(view.layers) < len(data.layers) else []
        stacks = {"time": layer_stack(data.summary, view, data.devices, batch, "time")}
        if len(data.priced_devices) > 1:
            stacks["cost"] = layer_stack(data.summary, view, data.priced_devices, batch, "cost")
        parts.append(_figure(heatmap_figure(stacks, view, batch)))
    return "\n".join(parts)


def section_per_batch(data: ReportData) -> str:
    """The log-axis view: the spread of layer times over orders of magnitude, with whiskers."""
    parts = ['<h2 id="layers">Spread per layer (log scale)</h2>',
             '<p class="note">Log axis: compare heights by orders of magnitude, not by length '
             '(<a href="#where">Where the time goes</a> shows lengths that add up).</p>']
    for batch in data.batches:
        view = replace(data.view, layers=data.heaviest(batch))
        parts += [_heaviest_note(data, len(view.layers))] if len(view.layers) < len(data.layers) else []
        parts.append(_figure(spread_figure(data.summary, view, data.devices, batch, "time")))
        if data.priced_devices:
            parts.append(_figure(spread_figure(data.summary, view, data.priced_devices, batch, "cost")))
    if not data.priced_devices:
        parts.append('<p class="note">No device has a price: pass --cost to see cost per sample.</p>')
    return "\n".join(parts)


def section_batch_scaling(data: ReportData) -> str:
    s = data.summary
    if len(data.batches) < 2 or not s["status"].isin(USABLE).any():
        return ('<h2 id="scaling">Time per sample against batch size</h2>'
                '<p class="note">Profile at two or more batch sizes to see how each layer scales.</p>')
    view = replace(data.view, layers=data.heaviest())
    fig = scaling_figure(s, view, data.devices)
    changes = crossovers(winners(data.summary, "time"))
    note = ("".join(f"<li><b>{_esc(c['layer'])}</b>: best device changes from {_esc(c['from_device'])} to "
                    f"{_esc(c['to_device'])} between batch {c['between'][0]} and {c['between'][1]}</li>"
                    for c in changes) or "<li>No layer's best device changes across the measured batch sizes "
                                         "(ties excluded).</li>")
    return (f'<h2 id="scaling">Time per sample against batch size</h2>{_heaviest_note(data, len(view.layers))}'
            f'{_figure(fig)}<ul>{note}</ul>')


def section_model_cost(data: ReportData) -> str:
    model = data.model
    if model.empty:
        return ""
    usable = model[model["status"].isin(MEASURED)]
    fig = go.Figure()
    priced = usable[usable["cost_per_sample_usd"].notna()]
    frame, what = (priced, "cost_per_sample_usd") if len(priced) else (usable, "per_sample_s")
    for device in sorted(frame["device"].unique()):
        rows = frame[frame["device"] == device].sort_values("batch_size")
        fig.add_scatter(x=list(rows["batch_size"]), y=list(rows[what]), mode="lines+markers", name=device,
                        line=dict(color=data.view.color(device)),
                        hovertemplate=f"{device}<br>batch %{{x}}<br>%{{y:.3s}}<extra></extra>")
    whole = data.view.whole_name
    label = f"{whole}: cost per sample (USD)" if what == "cost_per_sample_usd" else f"{whole}: time per sample (s)"
    fig.update_layout(title=label, xaxis=batch_axis(data.batches), yaxis=dict(type="log", title=label))
    marks = []
    cpu = frame[frame["device_kind"] == "cpu"]
    for device in sorted(frame[frame["device_kind"] != "cpu"]["device"].unique()):
        acc = frame[frame["device"] == device].set_index("batch_size")[what]
        for cpu_device in sorted(cpu["device"].unique()):
            ref = cpu[cpu["device"] == cpu_device].set_index("batch_size")[what]
            both = sorted(set(acc.index) & set(ref.index))
            pays = [b for b in both if acc[b] < ref[b]]
            if pays:
                marks.append(f"<li>{_esc(device)} is cheaper than {_esc(cpu_device)} from batch {pays[0]}</li>")
                fig.add_vline(x=pays[0], line_dash="dot", annotation_text=f"{device} pays from {pays[0]}")
            elif both:
                marks.append(f"<li>{_esc(device)} never beats {_esc(cpu_device)} at the measured batch sizes</li>")
    fixed = model[["device", "batch_size", "dispatch_overhead_s", "input_copy_s", "input_bytes", "first_call_s"]].copy()
    for column in ("dispatch_overhead_s", "input_copy_s", "first_call_s"):
        fixed[column] = fixed[column].map(format_seconds)
    fixed.columns = ["device", "batch", "dispatch / call", "input copy", "input bytes", "first call (trace+compile)"]
    overlap = ""
    if "overlapped_s" in model and model["overlapped_s"].notna().any():
        fixed["calls back to back / call"] = model["overlapped_s"].map(format_seconds).to_numpy()
        overlap = ('<p class="note">Calls back to back: a loop of independent calls lets the framework overlap them '
                   '(TensorFlow runs up to 10 loop iterations at once): per call this is throughput, not the time of '
                   'one call, which the figures above are.</p>')
    return (f'<h2 id="model">{whole.capitalize()}</h2>{_figure(fig)}<ul>{"".join(marks)}</ul>'
            f'<h3>Fixed costs, kept apart from layers</h3>{_table(fixed)}{overlap}')


def section_winners(data: ReportData) -> str:
    parts = ['<h2 id="winners">Best device per layer (with uncertainty)</h2>']
    for objective in ("time", "cost") if data.priced_devices else ("time",):
        table = winners(data.summary, objective)
        if table.empty:
            continue
        pivot = table.pivot(index="layer", columns="batch_size", values="label").reindex(data.layers).dropna(how="all")
        pivot.columns = [f"batch {b}" for b in pivot.columns]
        pivot.index = pivot.index.map(data.view.label)
        parts.append(f"<h3>{'Fastest' if objective == 'time' else 'Cheapest'}</h3>"
                     + _table(pivot.reset_index()))
    return "\n".join(parts)


def section_placement(data: ReportData) -> str:
    """The recommender's answer (solved by the caller, never here): placement, saving, frontier."""
    head = '<h2 id="placement">Recommended placement</h2>'
    rec = data.recommendation
    if rec is None:
        return head + ('<p class="note">No placement was computed for this report: run <code>tbs recommend '
                       f'{_esc(data.profile.directory)}</code>.</p>')
    if isinstance(rec, str):  # why there is none
        return head + f'<p class="note">{_esc(rec)}</p>'
    objective = rec.objective
    batch = rec.data.batch_size
    rows = rec.placement[["layer", "device"]].assign(
        **{"time / sample": rec.placement["seconds_per_sample"].map(format_seconds)})
    totals = comparison_table(rec)
    fig = go.Figure()
    if rec.frontier:
        points = [e.per_sample(batch) for e in rec.frontier]
        fig.add_scatter(x=[p["seconds_per_sample"] for p in points], y=[p["usd_per_1m_samples"] for p in points],
                        mode="lines+markers", name="frontier",
                        hovertemplate="%{x:.3s} s/sample<br>$%{y:.3s} per 1M<extra></extra>")
        for e in rec.single_devices:
            point = e.per_sample(batch)
            if point["usd_per_1m_samples"] is not None:
                fig.add_scatter(x=[point["seconds_per_sample"]], y=[point["usd_per_1m_samples"]],
                                mode="markers", marker=dict(size=11, symbol="diamond"), name=e.name)
        fig.update_layout(title=f"Cost–latency frontier at batch {batch}",
                          xaxis=dict(title="seconds per sample"), yaxis=dict(title="USD per 1M samples"))
    mode = f" In {_esc(rec.mode_note)}." if rec.mode == "training" else ""
    gain = saving_line(rec)
    return (f"{head}<p>Batch {batch}, minimising {objective} ({_esc(rec.billing)} billing), {_esc(rec.method)}; "
            f"transfers between devices included.{mode} Predicted from the profile: check it with "
            f"<code>tbs recommend {_esc(data.profile.directory)} --verify</code>.</p>"
            + (f'<p class="inactive">{_esc(rec.predicted_note)}</p>' if rec.predicted_note else "")
            + "".join(f'<p class="inactive">{_esc(note)}</p>' for note in (rec.data.batch_note, rec.data.dispatch_note)
                      if note)
            + f"{_table(pd.DataFrame(totals))}"
            + (f"<p>{_esc(gain)}.</p>" if gain else "")
            + f"{_table(rows)}"
            + (f"<p>Layers resting on a prediction (solved again with every predicted time at its 90% band's low "
               f"and high end):</p>{_table(pd.DataFrame(rec.prediction_dependence))}"
               if rec.prediction_dependence else "")
            + (_figure(fig) if rec.frontier else ""))


def _always(data: ReportData) -> bool:
    return True


def _training(data: ReportData) -> bool:
    return bool(data.training)


def _predicted(data: ReportData) -> bool:
    return data.profile.predictions is not None and len(data.profile.predictions) > 0


def _model_title(data: ReportData) -> str:
    return data.view.whole_name.capitalize() if data.training else "Whole model"


@dataclass(frozen=True)
class Section:
    """One section of the page: its anchor, its nav title (text, or from the data), its renderer, when it shows."""

    anchor: str
    title: str | Callable[[ReportData], str]
    render: Callable[[ReportData], str]
    applies: Callable[[ReportData], bool] = _always

    def nav(self, data: ReportData) -> tuple[str, str]:
        return self.anchor, self.title(data) if callable(self.title) else self.title


# The page, in order: what users look at first comes first (the summary, then where the time goes and each
# layer's best device); why a layer costs what it does right after what it costs. A new section is a
# renderer (in its own module) and one line here.
REGISTRY: list[Section] = [
    Section("summary", "Summary", section_summary),
    Section("training", "Training", training.section_training, _training),
    Section("phases", "Phases", training.section_phases, _training),
    Section("train-cost", "Cost per epoch", training.section_training_cost, _training),
    Section("memory", "Memory", training.section_training_memory, _training),
    Section("where", "Where the time goes", section_where),
    Section("every-layer", "Every layer", section_layer_table),
    Section("in-context", "In context", section_in_context, has_in_context),
    Section("relative", "Against the best", section_relative),
    Section("layers", "Spread (log)", section_per_batch),
    Section("scaling", "Batch size", section_batch_scaling),
    Section("model", _model_title, section_model_cost),
    Section("roofline", "Roofline", roofline.section_roofline),
    Section("fig2", "FLOPs & bytes", roofline.section_fig2),
    Section("capacity", "Largest batch", section_memory),
    Section("predicted", "Predicted", section_predicted, _predicted),
    Section("winners", "Winners", section_winners),
    Section("placement", "Placement", section_placement),
    Section("cells", "Every cell", section_cells),
    Section("missing", "Not measured", section_not_measured),
    Section("environment", "Environment", section_environment),
]

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:16px 24px;color:#222}
h1{font-size:1.6em;margin-bottom:0} h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:36px}
table{border-collapse:collapse;font-size:.85em} th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:left}
th{background:#f5f5f5;position:sticky;top:0} .scroll{max-height:480px;overflow:auto}
.note{color:#555;font-size:.9em} pre{background:#f7f7f7;padding:8px;font-size:.8em;overflow:auto}
nav a{margin-right:14px} code{white-space:nowrap}
.inactive{background:#fff8e1;padding:6px 10px;border-left:3px solid #b26a00}
"""


def sections(data: ReportData) -> list[Section]:
    """The sections this profile's page shows, in the registry's order."""
    return [section for section in REGISTRY if section.applies(data)]


def body(data: ReportData) -> tuple[str, list[tuple[str, str]]]:
    """The sections' HTML and the nav entries (anchor, text) that lead to them."""
    chosen = sections(data)
    return "\n".join(section.render(data) for section in chosen), [section.nav(data) for section in chosen]


def page(title: str, nav: list[tuple[str, str]], content: str) -> str:
    """The self-contained page around ``content``: style, plotly.js inlined, a title and a nav bar."""
    links = " ".join(f'<a href="#{anchor}">{_esc(text)}</a>' for anchor, text in nav)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><h1>{_esc(title)}</h1><nav>{links}</nav>{content}</body></html>")


def render(profile: Profile, dataset_size: int | None = None,
           recommendation: Recommendation | str | None = None, top: int | None = DEFAULT_TOP) -> str:
    """The self-contained HTML page; ``recommendation`` is a solved placement, or why there is none;
    ``top``: the heaviest layers each per-layer figure draws (None: every layer)."""
    content, nav = body(ReportData(profile, dataset_size, recommendation, top))
    return page(f"tbs report: {profile.meta.model.get('name', '')}", nav, content)
