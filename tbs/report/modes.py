"""An inference and a training profile of one model, side by side, in every format.

Both views are rendered whole (each with its own placement, when one was solved),
after what only the pair can show: what a training sample costs against an
inference sample per device, and the layers whose cheapest device differs between
the two modes. Nothing here measures or solves.
"""

from __future__ import annotations

import json as _json
import re
from dataclasses import dataclass

import pandas as pd

from tbs.errors import TbsError
from tbs.place.result import Recommendation
from tbs.profiles.profile import Profile, with_layer_sums
from tbs.report import console, html, json
from tbs.report.winners import mode_differences
from tbs.report.page import ReportData, esc, table
from tbs.schema import MEASURED
from tbs.units import format_seconds, format_usd, is_number

BY = {"cost": "cost per sample", "time": "time per sample (not every device has a price)"}


@dataclass
class Pair:
    """The two profiles (training, inference) and the placement solved for each, if any."""

    training: Profile
    inference: Profile
    training_rec: Recommendation | str | None = None
    inference_rec: Recommendation | str | None = None


def pair(profile: Profile, other_mode: Profile, recommendation: Recommendation | str | None = None,
         other_mode_recommendation: Recommendation | str | None = None) -> Pair:
    """Whichever order they come in: one must be training and the other inference."""
    modes = {profile.mode, other_mode.mode}
    if modes != {"training", "inference"}:
        raise TbsError(f"comparing needs one inference and one training profile: '{profile.directory}' and "
                       f"'{other_mode.directory}' are both {profile.mode}; profile the model with and without --training")
    if profile.mode == "training":
        return Pair(profile, other_mode, recommendation, other_mode_recommendation)
    return Pair(other_mode, profile, other_mode_recommendation, recommendation)


def _value(value: object, by: str) -> str:
    return format_usd(value) if by == "cost" else format_seconds(value)  # type: ignore[arg-type]


def _one_device(p: Pair) -> str:
    """Why there is nothing to compare, when the profiles share fewer than two devices ('' otherwise)."""
    common = sorted(set(p.inference.summary["device"].dropna()) & set(p.training.summary["device"].dropna()))
    if len(common) >= 2:
        return ""
    return (f"The two profiles share {len(common)} device ({', '.join(common) or 'none'}): there is no cheapest "
            "device to compare. Profile both modes on two or more devices.")


def differences(p: Pair) -> tuple[pd.DataFrame, int]:
    """The rows where the cheapest device differs (formatted), and how many layer x batch cells were compared."""
    found = mode_differences(p.inference.summary, p.training.summary)
    rows = [{"layer": r["layer"], "batch": int(r["batch_size"]), "compared by": BY[r["by"]],
             "cheapest in inference": f"{r['inference']} ({_value(r['inference_value'], r['by'])} / sample)",
             "cheapest in training": f"{r['training']} ({_value(r['training_value'], r['by'])} / sample)"}
            for _, r in found[found["differs"]].iterrows()]
    return pd.DataFrame(rows, columns=["layer", "batch", "compared by", "cheapest in inference",
                                       "cheapest in training"]), len(found)


def step_against_forward(p: Pair) -> pd.DataFrame:
    """Per device and batch in both: one inference sample against one training sample (whole model)."""
    keys = ["device", "batch_size"]
    inference, training = (with_layer_sums(x.summary, x.model) for x in (p.inference, p.training))
    if inference.empty or training.empty:
        return pd.DataFrame()
    both = inference.merge(training, on=keys, suffixes=("_i", "_t"))
    rows = []
    for _, r in both.sort_values(keys).iterrows():
        ok = r["status_i"] in MEASURED and r["status_t"] in MEASURED
        ratio = r["per_sample_s_t"] / r["per_sample_s_i"] if ok and r["per_sample_s_i"] else None
        rows.append({"batch": int(r["batch_size"]), "device": r["device"],
                     "inference / sample": format_seconds(r["per_sample_s_i"]) if r["status_i"] in MEASURED else "-",
                     "training / sample": format_seconds(r["per_sample_s_t"]) if r["status_t"] in MEASURED else "-",
                     "training ÷ inference": f"{ratio:.1f}×" if is_number(ratio) else "-",
                     "inference cost / 1M": format_usd(r["cost_per_sample_usd_i"] * 1e6)
                     if is_number(r["cost_per_sample_usd_i"]) else "no price",
                     "training cost / 1M": format_usd(r["cost_per_sample_usd_t"] * 1e6)
                     if is_number(r["cost_per_sample_usd_t"]) else "no price"})
    return pd.DataFrame(rows)


def section_modes(p: Pair) -> str:
    """What only the pair shows: a sample's cost in each mode, and where the cheapest device changes."""
    changed, compared = differences(p)
    whole = step_against_forward(p)
    verdict = _one_device(p) or (
        f"In {len(changed)} of {compared} layer × batch cells the cheapest device differs between inference "
        "and training." if compared else "No layer was measured in both modes at a common batch size.")
    return ('<h2 id="compare">Inference against training</h2>'
            '<p class="note">Inference: one forward pass per sample. Training: one whole train step per sample '
            '(forward, loss, backward, optimizer update), measured as one compiled step per device.</p>'
            + (table(whole) if len(whole) else '<p class="note">No whole-model time in both modes.</p>')
            + f'<h3>Where the cheapest device for a layer differs</h3><p>{esc(verdict)}</p>'
            + (table(changed) if len(changed) else "")
            + '<p class="note">Per layer and batch size measured in both: the cheapest device by cost per sample '
              'when every device has a price, otherwise the fastest (the table says which). "tie" where confidence '
              'intervals overlap; a tie differs only when it shares no device with the other mode\'s best.</p>')


def _prefixed(content: str, prefix: str) -> str:
    """Section anchors and the links to them made unique per view (plotly's div ids are left alone)."""
    content = re.sub(r'<h2 id="([\w-]+)"', lambda m: f'<h2 id="{prefix}{m.group(1)}"', content)
    return re.sub(r'href="#([\w-]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', content)


def render_html(p: Pair, dataset_size: int | None = None) -> str:
    """One page: the comparison, then the training view, then the inference view."""
    parts, nav = [section_modes(p)], [("compare", "Inference vs training")]
    for mode, profile, rec, prefix in (("Training", p.training, p.training_rec, "t-"),
                                       ("Inference", p.inference, p.inference_rec, "i-")):
        content, entries = html.body(ReportData(profile, dataset_size, rec))
        links = " ".join(f'<a href="#{prefix}{a}">{esc(t)}</a>' for a, t in entries)
        parts.append(f'<h1 id="{prefix}report" class="view">{mode}: {esc(profile.directory)}</h1>'
                     f'<nav>{links}</nav>{_prefixed(content, prefix)}')
        nav.append((f"{prefix}report", f"{mode} report"))
    name = p.training.meta.model.get("name", "")
    return html.page(f"tbs report: {name}, inference and training", nav, "\n".join(parts))


def render_text(p: Pair, dataset_size: int | None = None) -> str:
    """Both console views, each with its placement, then the table of changed cheapest devices."""
    parts = []
    for mode, profile, rec in (("training", p.training, p.training_rec), ("inference", p.inference, p.inference_rec)):
        text = console.render(profile, dataset_size)
        if isinstance(rec, Recommendation):
            text += f"\n\n{console.recommendation_text(rec)}"
        parts.append(f"== {mode}: {profile.directory} ==\n{text}")
    changed, compared = differences(p)
    head = f"== where the cheapest device differs: {len(changed)} of {compared} layer x batch cells =="
    if _one_device(p):
        head = f"== where the cheapest device differs: {_one_device(p)} =="
    parts.append(head + ("\n" + changed.to_string(index=False) if len(changed) else ""))
    return "\n\n".join(parts)


def render_json(p: Pair) -> str:
    """``{"training": ..., "inference": ..., "mode_differences": [...]}``, each view as ``tbs report`` writes it."""
    out = {}
    for mode, profile, rec in (("training", p.training, p.training_rec), ("inference", p.inference, p.inference_rec)):
        out[mode] = json.profile_dict(profile)
        if isinstance(rec, Recommendation):
            out[mode]["recommendation"] = json.recommendation_dict(rec)
    found = mode_differences(p.inference.summary, p.training.summary)
    out["mode_differences"] = _json.loads(found.to_json(orient="records"))
    return _json.dumps(out, indent=2, default=str)


def render_csv(p: Pair) -> str:
    """Both profiles' per-layer rows in one table (``mode`` tells them apart)."""
    return pd.concat([p.training.summary, p.inference.summary], ignore_index=True).to_csv(index=False)
