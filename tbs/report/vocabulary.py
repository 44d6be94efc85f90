"""The report's shared vocabulary: the marks, the sentences that explain them, and the few formatted
lines and tables every renderer (console text, HTML, figures) says the same way.

Kept apart from the text renderer (``console.py``) so the HTML report and its figures do
not depend on the console to say what a mark means.
"""

from __future__ import annotations

from typing import Any, Mapping

from tbs.place.result import Recommendation, comparison, saving
from tbs.profiles.profile import Profile
from tbs.units import format_bytes, format_seconds, format_usd, is_number

INACTIVE_MARK = "†"  # on the name of a layer that does nothing in the measured mode
NOT_IN_STEP_MARK = "‡"  # on a row the compiled train step never runs: shown, never summed
NOT_IN_STEP_MEANING = ("not run by the compiled train step: the loss reads the logits this activation keeps (Keras "
                       "on TensorFlow), so the step computes neither it nor its gradient; timed apart, shown, and "
                       "left out of Σ")


def inactive_layers(profile: Profile) -> list[str]:
    """Layers that only pass their input through in the measured mode (older profiles: none)."""
    return [layer.name for layer in profile.layers if layer.inactive]


def not_in_step(profile: Profile) -> list[str]:
    """Rows a training profile times but the compiled train step never runs (left out of Σ)."""
    return [layer.name for layer in profile.layers if layer.in_step is False]


def training_command(profile: Profile) -> str | None:
    """The command that measures this model in training, where inactive layers do their work."""
    if profile.mode != "inference":
        return None
    path = profile.meta.model.get("path") or "MODEL"
    out = f" --out {profile.directory}-training" if profile.directory.name else ""
    return f"tbs profile {path} --training{out}"


def inactive_meaning(profile: Profile) -> str:
    """Why an inactive layer's time is only call overhead, and how to see what it costs in training."""
    text = (f"{INACTIVE_MARK} inactive in {profile.mode}: the layer passes its input through unchanged in this mode "
            "(Dropout, random augmentation), so its time is call overhead only.")
    command = training_command(profile)
    return text + (f" To see what it costs in training: {command}" if command else "")


def capacity_line(device: str, found: Mapping[str, Any]) -> str:
    """One sentence: the largest batch that fits on ``device``, how it was found, or why it is unknown."""
    limit = found.get("limit_bytes")
    within = f" within {format_bytes(limit)}" if is_number(limit) else ""
    estimate = found.get("estimated_batch")
    largest = found.get("largest_batch")
    if not is_number(largest):
        if is_number(estimate) and not found.get("tries"):
            more = " or more" if found.get("estimate_capped") else ""
            note = f"; {found['note']}" if found.get("note") else ""
            return (f"{device}: the compiled programs' memory allows about batch {int(estimate):,}{more}{within} "
                    f"(compiler's estimate, not run: tbs profile --capacity confirms it by real calls{note})")
        compiler = f"; the compiler's memory line allowed {int(estimate):,}" if is_number(estimate) else ""
        return f"{device}: largest batch that fits unknown ({found.get('reason') or 'no call ran'}){compiler}"
    capped = " or more (the search stops there)" if found.get("capped") else ""
    compiler = f"; the compiler's memory line alone allowed {int(estimate):,}" if is_number(estimate) else ""
    why = f"; {found['reason']}" if found.get("reason") else ""
    return (f"{device}: largest batch that fits{within}: {int(largest):,}{capped}, confirmed by a real call"
            f"{compiler}{why}")


def comparison_table(rec: Recommendation) -> list[dict[str, str]]:
    """Totals per sample, formatted for people (console and HTML)."""
    return [{"placement": row["name"], "time / sample": format_seconds(row["seconds_per_sample"]),
             "cost / 1M samples": "no price" if row["usd_per_1m_samples"] is None else format_usd(row["usd_per_1m_samples"])}
            for row in comparison(rec)]


def saving_line(rec: Recommendation) -> str:
    """The recommendation against the best single device, and whether the measurements can tell them apart."""
    gain = saving(rec)
    if not gain:
        return ""
    text = f"Saving against the best single device ({gain['best_single_device']}): {gain['saving_fraction']:.1%}"
    if "saving_usd_per_1m_samples" in gain:
        text += f", {format_usd(gain['saving_usd_per_1m_samples'])} per 1M samples"
    worst = gain.get("saving_fraction_at_far_ends")
    if worst is None or gain["saving_fraction"] <= 0:
        return text
    if worst <= 0:
        return (f"{text}; within the measurements' noise: with each layer placed differently at the far end of its "
                f"95% confidence interval the saving is {worst:.1%}, so {gain['best_single_device']} is as "
                f"good as far as this profile can tell")
    return f"{text}; at least {worst:.1%} with each layer placed differently at the far end of its 95% interval"
