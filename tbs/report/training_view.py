"""The training view of the HTML report: each layer's phases, cost per training sample and per epoch,
the whole train step against its parts, and the memory training holds per layer.

A training profile's row is one layer's whole train step (forward + backward + update,
``median_s`` their sum) and the loss is a row of its own, so the inference sections
still read it right; these sections show what only training has. Nothing here
measures or solves; a missing value is blank, never 0.
"""

from __future__ import annotations

import pandas as pd

from tbs.report.winners import PHASES, phase_table, step_check, training_memory
from tbs.report.figures import PHASE_COLORS, phase_figure
from tbs.report.page import ReportData, esc, figure, table
from tbs.schema import LOSS_LAYER, MEASURED
from tbs.units import PER_MILLION, format_bytes, format_seconds, format_usd, is_number


def samples_per_epoch(data: ReportData) -> int | None:
    """N, the samples in one epoch: ``--dataset-size``, else what the profile recorded; None when unknown."""
    meta = data.profile.meta
    n = data.dataset_size or meta.samples
    return int(n) if is_number(n) and n else None


def _usd(value: object, scale: float = 1.0) -> str:
    return format_usd(float(value) * scale) if is_number(value) else "no price"  # type: ignore[arg-type]


def _what(entry: object) -> str:
    """'Adam (model.compile)' from {"name": ..., "source": ...}; '-' when not recorded."""
    if not isinstance(entry, dict) or not entry.get("name"):
        return "-"
    return f"{entry['name']} ({entry['source']})" if entry.get("source") else str(entry["name"])


def section_training(data: ReportData) -> str:
    """What one training row means, and what was trained with what."""
    meta = data.profile.meta.training
    optimizer = meta.get("optimizer") or {}
    config = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in (optimizer.get("config") or {}).items() if v is not None and k != "name")
    facts = [("loss", _what(meta.get("loss"))), ("optimizer", _what(optimizer) + (f": {config}" if config else "")),
             ("backward measured by", meta.get("backward_method") or "-"), ("targets", meta.get("targets") or "-")]
    facts += [("note", meta["note"])] if meta.get("note") else []  # why the model's own compile() was not used
    items = "".join(f"<li>{esc(k)}: <b>{esc(v)}</b></li>" for k, v in facts)
    return (f'<h2 id="training">Training</h2><ul>{items}</ul>'
            '<p class="note">Training profile: every layer\'s time is its whole train step on that device, '
            '<b>forward + backward + update</b> (a layer before any trainable one has only a forward; a layer '
            f'without weights has no update). The loss is a row of its own, <code>{esc(LOSS_LAYER)}</code> '
            '(forward + backward). Σ layers includes the loss and is checked against one compiled train step '
            'of the whole model.</p>')


def section_phases(data: ReportData) -> str:
    """Per batch, per layer and device, the forward, backward and update stacked."""
    phases = phase_table(data.profile.summary)
    colours = ", ".join(f'<span style="color:{c};font-weight:600">{p}</span>' for p, c in PHASE_COLORS.items())
    parts = ['<h2 id="phases">Forward, backward and update per layer</h2>',
             f'<p class="note">Per layer, one stacked bar per device: {colours}, per training sample, on a linear '
             'axis (the bar is the layer\'s train step). A phase that failed is left out of its bar and named in '
             'the hover.</p>']
    for batch in data.batches:
        parts.append(figure(phase_figure(phases, data.view, data.devices, batch)))
    return "\n".join(parts)


def _cost_rows(data: ReportData, epoch: int | None) -> list[dict[str, str]]:
    rows = []
    for _, r in data.model.sort_values(["batch_size", "device"]).iterrows():
        cost = r.get("cost_per_sample_usd") if r["status"] in MEASURED else None
        row = {"batch": int(r["batch_size"]), "device": r["device"], "status": r["status"],
               "train step / sample": format_seconds(r.get("per_sample_s")) if r["status"] in MEASURED else "-",
               "cost / training sample": _usd(cost), "cost / 1M training samples": _usd(cost, PER_MILLION)}
        if epoch:
            row[f"cost / epoch ({epoch:,} samples)"] = _usd(cost, epoch)
            row["time / epoch"] = (format_seconds(r["per_sample_s"] * epoch) if r["status"] in MEASURED
                                   and is_number(r.get("per_sample_s")) else "-")
        rows.append(row)
    return rows


def _check_rows(data: ReportData) -> list[dict[str, str]]:
    check = step_check(data.profile.summary, data.model, LOSS_LAYER)
    rows = []
    for _, c in check.sort_values(["batch_size", "device"]).iterrows():
        batch = int(c["batch_size"])
        rows.append({"batch": batch, "device": c["device"],
                     **{f"Σ {p}": format_seconds(c[f"{p}_sum_s"] / batch) for p in PHASES},
                     "loss": format_seconds(c["loss_s"] / batch),
                     "Σ layers + loss": format_seconds(c["layers_sum_s"] / batch),
                     "whole train step": format_seconds(c["step_s"] / batch),
                     "Σ / whole": f"{c['sum_over_step']:.2f}" if is_number(c["sum_over_step"]) else "-",
                     "rows summed": (f"{int(c['layers_measured'])} of {c['rows']}"
                                     if is_number(c["layers_measured"]) else "-")})
    return rows


def section_training_cost(data: ReportData) -> str:
    """Cost per training sample (and per epoch), then the whole step against the sum of its parts."""
    epoch = samples_per_epoch(data)
    head = '<h2 id="train-cost">Cost per training sample and per epoch</h2>'
    if data.model.empty:
        return head + '<p class="note">No whole train step was measured.</p>'
    note = ("" if epoch else '<p class="note">Give the dataset size (<code>--dataset-size N</code>) to see the cost '
            'of one epoch (N × cost per training sample).</p>')
    return (f'{head}<p class="note">One compiled train step of the whole model (forward, loss, backward, update) '
            'per device, divided by the batch size; "no price" where a device has none.</p>'
            f'{table(pd.DataFrame(_cost_rows(data, epoch)), "status")}{note}'
            '<h3>Whole train step against Σ phases + loss (per sample)</h3>'
            f'{table(pd.DataFrame(_check_rows(data)))}'
            '<p class="note">Σ / whole near 1 means the per-layer phases add up to the compiled train step; '
            'above 1 is what timing each phase alone adds (dispatch, lost fusion), below 1 what the step does '
            'that no layer row holds.</p>')


def section_training_memory(data: ReportData) -> str:
    """Weights, optimizer slots and residual activations per layer; blank where unknown."""
    memory = training_memory(data.profile.summary, data.layers)
    head = '<h2 id="memory">Training memory per layer</h2>'
    if memory.empty:
        return head + '<p class="note">No memory recorded.</p>'
    batches = [c.split("@")[1] for c in memory.columns if c.startswith("residual_bytes@")]
    shown = pd.DataFrame({"layer": memory["layer"].map(data.view.label),
                          "weights": memory["weight_bytes"].map(format_bytes),
                          "optimizer slots": memory["slot_bytes"].map(format_bytes),
                          **{f"residual activations, batch {b}": [
                              format_bytes(v) + (f" (unknown on {u})" if is_number(v) and u else "")
                              for v, u in zip(memory[f"residual_bytes@{b}"], memory[f"residual_unknown@{b}"])]
                             for b in batches}})
    totals = {"layer": "Σ (known)", "weights": format_bytes(memory["weight_bytes"].sum(min_count=1)),
              "optimizer slots": format_bytes(memory["slot_bytes"].sum(min_count=1))}
    for b in batches:
        unknown = int(memory[f"residual_bytes@{b}"].isna().sum())
        totals[f"residual activations, batch {b}"] = (format_bytes(memory[f"residual_bytes@{b}"].sum(min_count=1))
                                                      + (f" ({unknown} layer(s) unknown)" if unknown else ""))
    shown = pd.concat([shown, pd.DataFrame([totals])], ignore_index=True)
    return (f'{head}<p class="note">What training keeps per layer: its weights, the optimizer\'s slots for them '
            '(Adam: two per weight) and the activations its backward needs, at each batch size. Where devices '
            'differ the largest is shown. A blank cell is unknown (the backend did not say), not zero.</p>'
            f'{table(shown)}')


