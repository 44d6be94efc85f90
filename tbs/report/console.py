"""Console tables: per batch size, layers down, devices across, per-sample time and cost."""

from __future__ import annotations

import pandas as pd

from tbs.report.groups import DEFAULT_TOP, fold, grouped, layer_groups, measured_table, rank
from tbs.report.winners import winner
from tbs.profiles.profile import Profile, with_layer_sums
from tbs.place.result import Recommendation
from tbs.place.verify import Verification
from tbs.schema import MEASURED, NOT_MEASURED, Status
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number
from tbs.predictions.whole import band_percent
from tbs.report.vocabulary import (INACTIVE_MARK, NOT_IN_STEP_MARK, NOT_IN_STEP_MEANING, capacity_line,
                                   comparison_table, inactive_layers, inactive_meaning, not_in_step, saving_line)



def _cell_text(row: pd.Series, fastest: str, cheapest: str, priced: bool) -> str:
    if row["status"] in NOT_MEASURED or not is_number(row["per_sample_s"]):
        return str(row["status"]).upper()
    text = format_seconds(row["per_sample_s"])
    if priced:
        cost = row["cost_per_sample_usd"]
        text += f" {format_usd(cost * PER_MILLION) if is_number(cost) else 'no price'}"
    in_model = row.get("in_model_s")
    if is_number(in_model):
        text += f" (in model {format_seconds(in_model / row['batch_size'])})"
    marks = fastest + cheapest
    if row["status"] != Status.OK:
        marks += f" [{row['status']}]"
    return f"{text} {marks}".rstrip()


def _best(rows: pd.DataFrame, objective: str) -> tuple[set[str], bool]:
    """The winning device(s) and whether it is a tie (confidence intervals overlap)."""
    if len(rows) < 2:
        return set(), False
    result = winner(rows, objective)
    return set(result["devices"]), bool(result["tie"])


def _layer_rows(profile: Profile, summary: pd.DataFrame, devices: list[str], priced: bool,
                top: int | None) -> tuple[list[dict[str, str]], str]:
    """A row per layer, in model order, or the ``top`` heaviest and a fold line for the rest."""
    inactive, skipped = set(inactive_layers(profile)), set(not_in_step(profile))
    summed = [layer for layer in profile.layer_names if layer not in skipped]
    batch = int(summary["batch_size"].iloc[0]) if len(summary) else 0
    folded = fold(measured_table(summary, summed, devices, batch), top)
    shown = folded.shown + [layer for layer in profile.layer_names if layer in skipped] if folded.folded \
        else profile.layer_names
    rows = []
    for layer in shown:
        cells = summary[summary["layer"] == layer]
        if cells.empty:
            continue
        (fastest, fast_tie), (cheapest, cheap_tie) = _best(cells, "time"), _best(cells, "cost")
        name = f"{layer} {INACTIVE_MARK}" if layer in inactive else f"{layer} {NOT_IN_STEP_MARK}" if layer in skipped \
            else layer
        line = {"layer": name, "category": cells.iloc[0]["category"]}
        for device in devices:
            cell = cells[cells["device"] == device]
            fast = ("~" if fast_tie else "*") if device in fastest else ""
            cheap = ("≈$" if cheap_tie else "$") if device in cheapest else ""
            line[device] = "" if cell.empty else _cell_text(cell.iloc[0], fast, cheap, priced)
        rows.append(line)
    if not folded.folded:
        return rows, ""
    rows.append({"layer": f"… {len(folded.folded)} more layers", "category": "",
                 **{d: _fold_text(folded.folded_totals.get(d), folded.share(d)) for d in devices}})
    return rows, (f"; the {len(folded.shown)} heaviest of {len(summed)} layers, heaviest first "
                  "(--all: every layer; --group kind|block: totals)")


def _fold_text(seconds: float | None, share: float | None) -> str:
    """The time the folded rows add up to, and their share of Σ layers."""
    if not is_number(seconds):
        return "-"
    return f"{format_seconds(seconds)} ({share:.1%} of the time)" if is_number(share) else format_seconds(seconds)


def _group_rows(profile: Profile, summary: pd.DataFrame, devices: list[str], priced: bool, by: str,
                top: int | None) -> tuple[list[dict[str, str]], str]:
    """A row per kind or block: its layers' Σ time per sample (share of Σ layers) and cost, heaviest first."""
    skipped = set(not_in_step(profile))
    summed = [layer for layer in profile.layer_names if layer not in skipped]
    batch = int(summary["batch_size"].iloc[0]) if len(summary) else 0
    times, counts = grouped(measured_table(summary, summed, devices, batch), layer_groups(profile), by)
    costs, _ = grouped(measured_table(summary, summed, devices, batch, "cost_per_sample_usd"),
                       layer_groups(profile), by)
    folded = fold(times, top)
    rows = []
    for name in (rank(times) if top is not None else list(times.index))[:len(folded.shown)]:
        line = {by: name, "layers": str(int(counts[name]))}
        for device in devices:
            share = times.loc[name, device] / folded.totals[device] if folded.totals.get(device) else None
            text = _fold_text(times.loc[name, device], None)
            text += f" {share:.1%}" if is_number(share) and is_number(times.loc[name, device]) else ""
            cost = costs.loc[name, device] if device in costs and name in costs.index else None
            line[device] = text + (f" {format_usd(cost * PER_MILLION)}" if priced and is_number(cost) else "")
        rows.append(line)
    if folded.folded:
        rows.append({by: f"… {len(folded.folded)} more {by}s", "layers": str(int(counts[folded.folded].sum())),
                     **{d: _fold_text(folded.folded_totals.get(d), folded.share(d)) for d in devices}})
    return rows, f"; Σ per {by} of {len(summed)} layers and its share of Σ layers, heaviest first"


def batch_table(profile: Profile, batch_size: int, top: int | None = DEFAULT_TOP, group: str | None = None) -> str:
    """One batch size: the layers (the ``top`` heaviest and a fold, or all) or their totals per kind or block."""
    summary = profile.summary[profile.summary["batch_size"] == batch_size]
    devices = sorted(summary["device"].unique()) if not summary.empty else []
    priced = summary["cost_per_sample_usd"].map(is_number).any() if not summary.empty else False
    rows, caption = (_group_rows(profile, summary, devices, priced, group, top) if group
                     else _layer_rows(profile, summary, devices, priced, top))
    model = with_layer_sums(profile.summary, profile.model)
    model = model[model["batch_size"] == batch_size] if not model.empty else model
    rows += _total_rows(profile, model, devices, group)
    training = profile.mode == "training"
    header = f"batch {batch_size}: {'train step (forward+backward+update) ' if training else ''}time per sample"
    if priced:
        header += " and cost per 1M samples"
    legend = ("* fastest  $ cheapest  (~ / ≈$: tied within confidence intervals)  [status] where not ok"
              if len(devices) > 1 else "[status] where not ok")
    table = pd.DataFrame(rows).to_string(index=False) if rows else "(nothing measured)"
    lines = [header + caption, table] + ([] if group else [legend])
    return "\n".join(lines + _whole_model_lines(model, "whole train step" if training else "whole model"))


def _total_rows(profile: Profile, model: pd.DataFrame, devices: list[str], group: str | None) -> list[dict[str, str]]:
    """The table's last two rows: Σ layers (with how many were summed where some failed) and the whole model."""
    training = profile.mode == "training"
    key = group or "layer"
    skipped = set(not_in_step(profile))
    rows = []
    for label, column in (("Σ layers + loss" if training else "Σ layers", "layers_sum_per_sample_s"),
                          ("whole train step" if training else "whole model", "per_sample_s")):
        line = {key: label, "layers" if group else "category": ""}
        for device in devices:
            cell = model[model["device"] == device] if not model.empty else model
            value = cell.iloc[0][column] if not cell.empty else None
            status = str(cell.iloc[0].get("status", "")) if not cell.empty else ""
            failed = column == "per_sample_s" and status not in ("",) + MEASURED
            line[device] = format_seconds(value) if is_number(value) else (status.upper() if failed else "-")
            if column == "layers_sum_per_sample_s" and is_number(value):
                measured = int(cell.iloc[0]["layers_measured"])
                summed = len([l for l in profile.layer_names if l not in skipped])
                if measured < summed:  # failed layers are not in the sum: say so
                    line[device] += f" ({measured} of {summed} layers)"
        rows.append(line)
    return rows


def _whole_model_lines(model: pd.DataFrame, whole: str) -> list[str]:
    """Per device: the whole model's time per call with its fixed costs apart, or why it has none."""
    lines = []
    for _, m in (model.iterrows() if not model.empty else []):
        if is_number(m.get("median_s")):
            lines.append(
                f"{m['device']}: {whole} {format_seconds(m['median_s'])}/call; fixed costs apart: "
                f"dispatch {format_seconds(m.get('dispatch_overhead_s'))}/call, "
                f"input copy {format_seconds(m.get('input_copy_s'))}, first call {format_seconds(m.get('first_call_s'))}"
                + overlap_note(m)
            )
        else:
            lines.append(f"{m['device']}: {whole} {m.get('status')}: {m.get('reason')}")
        if is_number(m.get("in_model_s")):
            lines.append(in_context_line(m))
    return lines


def in_context_line(model_row: pd.Series) -> str:
    """The traced whole call: its span, what the layers own of it, and the framework's own time."""
    whole, unowned = model_row["in_model_s"], model_row.get("unowned_s")
    own = f"{format_seconds(unowned)} ({unowned / whole:.1%})" if is_number(unowned) and whole > 0 else "-"
    return (f"{model_row['device']}: in context ({int(model_row['traced_calls'])} traced calls): one call "
            f"{format_seconds(whole)} = Σ layers in model {format_seconds(whole - (unowned or 0.0))} + the "
            f"framework's own {own}")


def overlap_note(model_row: pd.Series) -> str:
    """Where back-to-back calls overlap (throughput) differently from one call at a time, by more than 10%."""
    one, overlapped = model_row.get("median_s"), model_row.get("overlapped_s")
    if not (is_number(one) and is_number(overlapped) and overlapped > 0) or abs(one / overlapped - 1) <= 0.1:
        return ""
    return (f"; back-to-back calls overlap at {format_seconds(overlapped)}/call "
            f"({one / overlapped:.2g}x one call's throughput)")


def _phase_cell(row: pd.Series) -> str:
    """'fwd / bwd / upd' per sample; a failed phase '-', a phase the layer does not have '0'."""
    parts = []
    for phase in ("forward", "backward", "update"):
        value = pd.to_numeric(pd.Series([row.get(f"{phase}_s")]), errors="coerce").iloc[0]
        parts.append("-" if not is_number(value) else "0" if value == 0 else format_seconds(value / row["batch_size"]))
    return " / ".join(parts)


def phase_table(profile: Profile, batch_size: int) -> str:
    """Training: per layer and device, forward / backward / update per sample."""
    summary = profile.summary[profile.summary["batch_size"] == batch_size]
    devices = sorted(summary["device"].unique())
    rows = []
    for layer in profile.layer_names:
        cells = summary[summary["layer"] == layer]
        if cells.empty:
            continue
        phases = cells.iloc[0]["phases"]
        line = {"layer": layer, "phases": phases if isinstance(phases, str) else ""}
        for device in devices:
            cell = cells[cells["device"] == device]
            line[device] = "" if cell.empty else _phase_cell(cell.iloc[0])
        rows.append(line)
    return (f"batch {batch_size}: forward / backward / update per sample (-: failed, 0: no such phase)\n"
            + pd.DataFrame(rows).to_string(index=False))


def epoch_lines(profile: Profile, dataset_size: int) -> list[str]:
    """Training: the cost of one epoch of ``dataset_size`` samples per device and batch (whole train steps)."""
    model = profile.model
    lines = []
    for _, m in model.sort_values(["batch_size", "device"]).iterrows() if not model.empty else []:
        measured = m.get("status") in MEASURED
        cost = m.get("cost_per_sample_usd") if measured else None
        time = format_seconds(m["per_sample_s"] * dataset_size) if measured else str(m.get("status"))
        lines.append(f"{m['device']} @ batch {int(m['batch_size'])}: one epoch of {dataset_size:,} samples "
                     f"{format_usd(cost * dataset_size) if is_number(cost) else 'no price'} ({time})")
    return lines


def render(profile: Profile, dataset_size: int | None = None, top: int | None = DEFAULT_TOP,
           group: str | None = None) -> str:
    """A table per batch size (training: and its phases); what † means, once, at the end.

    ``top``: the heaviest layers shown, the rest folded into one line (None: every layer, in model
    order); ``group``: 'kind' or 'block' totals instead of the layers.
    """
    batches = sorted(set(profile.summary["batch_size"].dropna().astype(int))) if not profile.summary.empty else []
    tables = [batch_table(profile, b, top, group) for b in batches]
    if profile.mode == "training":
        tables = [f"{t}\n\n{phase_table(profile, b)}" for t, b in zip(tables, batches)]
        if dataset_size:
            tables.append("\n".join(epoch_lines(profile, dataset_size)))
    text = "\n\n".join(tables)
    if not profile.summary.empty and set(inactive_layers(profile)) & set(profile.summary["layer"]):
        text += "\n\n" + inactive_meaning(profile)
    if not profile.summary.empty and set(not_in_step(profile)) & set(profile.summary["layer"]):
        text += f"\n\n{NOT_IN_STEP_MARK} {', '.join(not_in_step(profile))}: {NOT_IN_STEP_MEANING}."
    capacity = capacity_lines(profile)
    if capacity:
        text += "\n\n" + "\n".join(capacity)
    predicted = predicted_lines(profile)
    return f"{text}\n\n{predicted}" if predicted else text


def capacity_lines(profile: Profile) -> list[str]:
    """A line per device with something to say (an estimate or a search); none for a device without sizes."""
    return [capacity_line(d, f) for d, f in profile.meta.capacity.items()
            if f.get("estimated_batch") is not None or f.get("tries")]


def predicted_lines(profile: Profile) -> str:
    """The whole model on devices predicted, not measured: kept apart, labelled, with its band (its level named)."""
    p = profile.predictions
    if p is None or p.empty:
        return ""
    whole = p[(p["target"] == "model") & pd.to_numeric(p["per_sample_s"], errors="coerce").notna()]
    methods = {str(m).split(";")[0] for m in whole["method"] if isinstance(m, str)}  # "roofline scaling from X"
    how = f" by {methods.pop()}" if len(methods) == 1 else ""
    lines = [f"Predicted (not measured){how}: whole model time per sample [{band_percent(whole['method'])} band], "
             "USD per 1M samples. "
             "Estimates, never measured here: measure on the device before deciding."] if len(whole) else []
    for _, r in whole.sort_values("batch_size", kind="stable").iterrows():
        batch, cost = r["batch_size"], r["cost_per_sample_usd"]
        source = "" if how else f" ({str(r['method']).split(';')[0]})"
        lines.append(f"  {r['device']} @ batch {int(batch)}: {format_seconds(r['per_sample_s'])}/sample "
                     f"[{format_seconds(r['low_s'] / batch)} – {format_seconds(r['high_s'] / batch)}], "
                     f"{f'${cost * PER_MILLION:.3g}/1M' if is_number(cost) else 'no price'}{source}")
    reasons = pd.Series([r if isinstance(r, str) else "" for r in p["reason"]], dtype=str)
    skipped = reasons[reasons.str.startswith("not predicted")]
    for reason, count in skipped.value_counts().items():
        lines.append(f"  {count} cell(s) {reason} (listed in the HTML report)")
    return "\n".join(lines)


def recommendation_text(rec: Recommendation) -> str:
    """The placement per layer, the totals against single devices, the saving and the frontier."""
    batch = rec.data.batch_size
    layers = rec.placement
    layers["time / sample"] = layers.pop("seconds_per_sample").map(format_seconds)
    layers["cost / sample"] = layers.pop("usd_per_sample").map(format_usd)
    layers["transfer in"] = layers.pop("transfer_in_seconds_per_sample").map(format_seconds)
    if "gradient_in_seconds_per_sample" in layers:
        layers["gradient in"] = layers.pop("gradient_in_seconds_per_sample").map(format_seconds)
    dispatch = layers.pop("dispatch_seconds_per_sample")
    if (dispatch > 0).any():  # the layers that start a program call
        layers["dispatch"] = dispatch.map(lambda s: format_seconds(s) if s > 0 else "")
    mode = f"; {rec.mode_note}" if rec.mode == "training" else ""
    lines = [f"Placement for batch {batch}: minimise {rec.objective} ({rec.billing} billing), {rec.method}; "
             f"times predicted from the profile{mode}",
             layers.to_string(index=False), "", pd.DataFrame(comparison_table(rec)).to_string(index=False)]
    gain = saving_line(rec)
    if gain:
        lines += ["", gain]
    if rec.frontier:
        lines += ["", "Cost-latency frontier (per sample): " + "; ".join(
            f"{format_seconds(e.per_sample(batch)['seconds_per_sample'])} at "
            f"{format_usd(e.per_sample(batch)['usd_per_1m_samples'])}/1M" for e in rec.frontier)]
    if rec.predicted_note:
        lines += ["", f"Note: {rec.predicted_note}"]
    for note in (rec.data.batch_note, rec.data.dispatch_note):
        if note:
            lines += ["", f"Note: {note}"]
    lines += dependence_lines(rec)
    if rec.verification is not None:
        lines.append(verification_text(rec.verification))
    return "\n".join(lines)


def dependence_lines(rec: Recommendation) -> list[str]:
    """Which layers' device rests on a prediction, and whether its band could move them."""
    if not rec.prediction_dependence:
        return []
    rows = [{"layer": r["layer"], "device": r["device"] + (" (predicted)" if r["device_predicted"] else ""),
             "at band low": r["at_band_low"] or "–", "at band high": r["at_band_high"] or "–",
             "band could flip it": "yes" if r["could_flip"] else "no"} for r in rec.prediction_dependence]
    flips = sum(r["could_flip"] for r in rec.prediction_dependence)
    return ["", f"Layers resting on a prediction (solved again with every predicted time at its 90% band's low and "
                f"high end): {flips} of {len(rows)} could flip", pd.DataFrame(rows).to_string(index=False)]


def verification_text(ver: Verification) -> str:
    """Predicted against measured per placement, where the ops really ran, and the verdict."""
    rows = [{"placement": r["placement"], "predicted / sample": format_seconds(r["predicted_seconds_per_sample"]),
             "measured / sample": format_seconds(r["measured_seconds_per_sample"]),
             "95% CI": f"{format_seconds(r['ci_low_seconds_per_sample'])} – {format_seconds(r['ci_high_seconds_per_sample'])}",
             "error": f"{r['relative_error']:+.1%}", "status": r["status"]}
            for r in ver.table.to_dict("records")]
    return "\n".join([
        "", f"Verified by running it (batch {ver.batch_size}, from host inputs, interleaved rounds):",
        pd.DataFrame(rows).to_string(index=False),
        f"{ver.placed_right} of {ver.layers} layers ran their ops on the device they were placed on.",
        f"Verdict: {ver.verdict} (best single device measured: {ver.best_single.name}).",
    ])
