"""Where the time and the money go, readable from 5 to 500 layers: the heaviest layers with the rest
folded into one grey segment, the shares per layer kind and per block, and every layer in one
sortable, filterable table (plain HTML and a few lines of script, not a plotly trace per layer).

Nothing here measures: every total is of the profile's measured cells.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from tbs.report.vocabulary import not_in_step
from tbs.report.figures import fmt, layer_stack, missing_cells, stacked_figure, whole_model
from tbs.report.groups import fold, grouped, measured_table
from tbs.report.page import ReportData, esc, figure
from tbs.schema import USABLE
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number

GROUP_COLORS = qualitative.Dark24  # kinds and blocks: many, and unlike the layer and device colours
TABLE_SCRIPT = """
<script>
function tbsSort(th){const table=th.closest('table'),body=table.tBodies[0],col=th.cellIndex,
 up=th.dataset.dir!=='asc';th.dataset.dir=up?'asc':'desc';
 const key=r=>{const c=r.cells[col],v=c.dataset.v;return v===undefined?c.textContent.toLowerCase():(v===''?null:+v)};
 const rows=Array.from(body.rows).sort((a,b)=>{const x=key(a),y=key(b);if(x===y)return 0;
  if(x===null)return 1;if(y===null)return -1;return (x<y?-1:1)*(up?1:-1)});
 rows.forEach(r=>body.appendChild(r));}
function tbsFilter(input){const q=input.value.toLowerCase(),table=document.getElementById(input.dataset.table);
 let shown=0;Array.from(table.tBodies[0].rows).forEach(r=>{const hit=r.dataset.k.includes(q);
  r.style.display=hit?'':'none';shown+=hit});
 document.getElementById(input.dataset.table+'-count').textContent=shown;}
</script>"""


def folded_stack(stack: pd.DataFrame, top: int | None) -> tuple[pd.DataFrame, str | None]:
    """The ``top`` heaviest rows in model order and one row summing the rest (its name), or the stack as it is."""
    folded = fold(stack, top)
    if not folded.folded:
        return stack, None
    name = f"{len(folded.folded)} more layers"
    rest = stack.loc[folded.folded].sum(axis=0, min_count=1).rename(name)
    return pd.concat([stack.loc[[r for r in stack.index if r in set(folded.shown)]], rest.to_frame().T]), name


def group_figure(data: ReportData, by: str) -> go.Figure:
    """Every (batch, device) as one bar of 100%, split into the kinds or blocks; the hover gives the time."""
    fig = go.Figure()
    summed = data.view.summed
    tables, counts = {}, pd.Series(dtype=float)
    for batch in data.batches:
        tables[batch], counts = grouped(measured_table(data.summary, summed, data.devices, batch), data.groups, by)
    joined = pd.concat([t.add_prefix(f"batch {b} · ") for b, t in tables.items()], axis=1)
    joined = joined.loc[:, joined.notna().any(axis=0)]  # a device with no cell at a batch: no empty bar
    folded = fold(joined, data.top)
    names = [g for g in joined.index if g in set(folded.shown)]
    rest = f"{len(folded.folded)} more {by}s" if folded.folded else None
    labels = list(joined.columns)
    for i, name in enumerate(names + ([rest] if rest else [])):
        values = joined.loc[name] if name != rest else joined.loc[folded.folded].sum(axis=0, min_count=1)
        layers = int(counts.get(name, 0)) if name != rest else int(counts.reindex(folded.folded).sum())
        fig.add_bar(orientation="h", y=labels, x=[float(v) if is_number(v) else None for v in values], name=name,
                    marker=dict(color="#c7c7c7" if name == rest else GROUP_COLORS[i % len(GROUP_COLORS)],
                                line=dict(color="white", width=0.5)),
                    text=[name] * len(labels), textposition="inside", insidetextanchor="middle",
                    customdata=[[fmt(v, "time"), layers] for v in values],
                    hovertemplate=f"<b>{esc(name)}</b> (%{{customdata[1]}} layers), %{{y}}<br>%{{customdata[0]}} "
                                  "per sample, %{x:.1f}% of Σ layers<extra></extra>")
    what = "layer kind" if by == "kind" else "block (Keras nesting, or the name prefix)"
    fig.update_layout(barmode="stack", barnorm="percent", title=f"Share of Σ layers' time per {what}",
                      height=max(150 + 36 * len(labels), 110 + 19 * (len(names) + 1)),  # bars, or the legend
                      uniformtext=dict(minsize=9, mode="hide"),  # a name inside its segment where it fits
                      legend=dict(orientation="v", x=1.01, y=1, traceorder="normal", font=dict(size=11)),
                      yaxis=dict(autorange="reversed", automargin=True),
                      xaxis=dict(title="% of Σ layers (time; on one device cost splits the same)", range=[0, 100]))
    return fig


def section_where(data: ReportData) -> str:
    """Per batch, the heaviest layers stacked (the rest folded), ◆ the whole model; then kinds and blocks."""
    view, model, parts = data.view, data.model, ['<h2 id="where">Where the time and the money go</h2>']
    whole = ("one compiled train step of the whole model" if data.training
             else "the whole model measured as one compiled call")
    folds = bool(data.top) and len(view.summed) > data.top
    parts.append('<h3 id="kinds">By layer kind and by block</h3><p class="note">Each bar is Σ layers of one batch '
                 'size on one device, as 100%; hover a segment for its time per sample. Kinds: what the layers do '
                 '(activation, merge and reshape apart from "other"); blocks: the Keras model nesting, or for a flat '
                 'model the name up to its last numbered part (<code>conv2_block1_1_conv</code> is in '
                 '<code>conv2_block1</code>). <code>tbs report DIR --group kind|block</code> prints the same.</p>')
    parts += [figure(group_figure(data, "kind")), figure(group_figure(data, "block"))] if data.batches else []
    parts.append('<h3 id="heaviest">The heaviest layers</h3>' if folds else '<h3 id="heaviest">Each layer</h3>')
    rest = (f" (the {data.top} heaviest layers; the grey segment is the other layers summed)" if folds else "")
    parts.append(f'<p class="note">One bar per device; each segment is one layer\'s median time (or cost) per '
                 f'sample on that device{rest}, in model order, on a linear axis: the bar\'s length is the sum of '
                 f'the layers (Σ). ◆ is {whole}; Σ above ◆ is what running the layers one by one adds (dispatch, '
                 'lost fusion). Only measured cells are summed. Every layer: <a href="#every-layer">the table</a>.'
                 '</p>')
    unpriced = [d for d in data.devices if d not in data.priced_devices]
    for batch in data.batches:
        for objective in ("time", "cost") if data.priced_devices else ("time",):
            devices = data.devices if objective == "time" else data.priced_devices
            stack = layer_stack(data.summary, view, devices, batch, objective).loc[view.summed]  # what adds up
            drawn, folded = folded_stack(stack, data.top)
            fig = stacked_figure(drawn, whole_model(model, batch, objective),
                                 missing_cells(data.summary, stack, batch), view, batch, objective, folded)
            parts.append(figure(fig))
    if not data.priced_devices:
        parts.append('<p class="note">No device has a price, so no cost bars: pass --cost to tbs report.</p>')
    elif unpriced:
        parts.append(f'<p class="note">Left out of the cost bars (no price, not $0): {esc(", ".join(unpriced))}. '
                     'Pass --cost to tbs report to price them.</p>')
    return "\n".join(parts)


def _cells(row_cells: pd.DataFrame, device: str, total: float | None, priced: bool) -> str:
    """One (batch, device)'s cells of a layer: time per sample and share of Σ, and cost per 1M; blank if none."""
    cell = row_cells[row_cells["device"] == device]
    seconds = cell["per_sample_s"].iloc[0] if len(cell) and cell["status"].iloc[0] in USABLE else None
    if not is_number(seconds):
        status = str(cell["status"].iloc[0]) if len(cell) else ""
        out = f'<td data-v="">{esc(status)}</td>'
        return out + ('<td data-v=""></td>' if priced else "")
    share = f" · {seconds / total:.1%}" if is_number(total) and total > 0 else ""
    out = f'<td data-v="{seconds:.6g}">{esc(format_seconds(seconds))}{share}</td>'
    if priced:
        cost = cell["cost_per_sample_usd"].iloc[0]
        out += (f'<td data-v="{cost * PER_MILLION:.6g}">{esc(format_usd(cost * PER_MILLION))}</td>'
                if is_number(cost) else '<td data-v="">no price</td>')
    return out


def section_layer_table(data: ReportData) -> str:
    """Every layer in one table: click a heading to sort, type to filter by layer, kind or block."""
    head = '<h2 id="every-layer">Every layer</h2>'
    if data.summary.empty:
        return head + '<p class="note">Nothing measured.</p>'
    priced = bool(data.priced_devices)
    skipped = set(not_in_step(data.profile))
    totals = {b: measured_table(data.summary, data.view.summed, data.devices, b).sum(axis=0, min_count=1)
              for b in data.batches}
    columns = ["#", "layer", "kind", "block"]
    for batch in data.batches:
        for device in data.devices:
            columns.append(f"batch {batch} {device}: time / sample · share")
            columns += [f"batch {batch} {device}: $ / 1M samples"] if priced else []
    by_layer = dict(tuple(data.summary.groupby("layer", sort=False)))
    rows = []
    groups = data.groups.set_index("layer")
    for i, layer in enumerate(data.layers, start=1):
        kind, block = groups.loc[layer, "kind"], groups.loc[layer, "block"]
        label = data.view.label(layer)
        cells = by_layer.get(layer, data.summary.iloc[0:0])
        values = "".join(_cells(cells[cells["batch_size"] == b], d, None if layer in skipped else totals[b].get(d),
                                priced) for b in data.batches for d in data.devices)
        key = esc(f"{layer} {kind} {block}".lower())
        rows.append(f'<tr data-k="{key}"><td data-v="{i}">{i}</td><td>{esc(label)}</td><td>{esc(kind)}</td>'
                    f'<td>{esc(block)}</td>{values}</tr>')
    header = "".join(f'<th onclick="tbsSort(this)" title="click to sort">{esc(c)}</th>' for c in columns)
    return (f'{head}<p class="note">Click a heading to sort (again to reverse); the share is of Σ layers on that '
            'device and batch. Blank: not measured (its status says why).</p>'
            '<p><input type="search" placeholder="filter: layer, kind or block" data-table="layer-table" '
            'oninput="tbsFilter(this)" size="40"> <span id="layer-table-count">'
            f'{len(rows)}</span> of {len(rows)} layers</p>'
            f'<div class="scroll"><table id="layer-table"><thead><tr>{header}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{TABLE_SCRIPT}')
