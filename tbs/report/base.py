"""One entry to every renderer: a Profile (and a solved Recommendation) in, text out.

Renderers return strings and never measure or solve; writing files is the
caller's job (the API and the CLI).
"""

from __future__ import annotations

from tbs.errors import TbsError
from tbs.place.result import Recommendation
from tbs.profiles.profile import Profile
from tbs.report import modes
from tbs.report import console, html, json, predicted_text, trace
from tbs.report.groups import DEFAULT_TOP, GROUPINGS
from tbs.units import is_number

FORMATS = ("text", "html", "json", "csv", "predicted", "trace")


def render(profile: Profile | None, fmt: str = "text", recommendation: Recommendation | str | None = None,
           dataset_size: int | None = None, other_mode: Profile | None = None,
           other_mode_recommendation: Recommendation | str | None = None, top: int | None = DEFAULT_TOP,
           group: str | None = None) -> str:
    """``fmt`` is text (console tables), html (the self-contained report), json or csv (the per-layer rows),
    or predicted (each layer's predicted devices beside the measured one it was scaled from, as text),
    or trace (a Chrome/Perfetto trace-event JSON: the traced whole-model calls op by op under their layers,
    and the isolated cells end to end).

    ``recommendation`` adds the placement (a str says why there is none); ``dataset_size``
    adds the cost of a workload of that many samples (in training: of one epoch); by default
    the dataset size the profile recorded (``tbs profile --dataset-size``).
    ``other_mode`` is the same model's profile in the other mode (inference against
    training, either order): both views are rendered, with the layers whose cheapest
    device differs between the modes; ``other_mode_recommendation`` is its placement.
    ``top``: text and html show the ``top`` heaviest layers and fold the rest into one line
    (None: every layer); ``group`` ('kind' or 'block'): text shows totals per group instead.
    """
    if fmt not in FORMATS:
        raise TbsError(f"format '{fmt}' is not one of {', '.join(FORMATS)}")
    if group is not None and group not in GROUPINGS:
        raise TbsError(f"group '{group}' is not one of {', '.join(GROUPINGS)}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise TbsError(f"top={top!r}: give a whole number of layers, 1 or more (or None for every layer)")
    rec = recommendation if isinstance(recommendation, Recommendation) else None
    if profile is None:
        if rec is None or fmt not in ("text", "json"):
            raise TbsError("render needs a profile (or a recommendation, as text or json)")
        return console.recommendation_text(rec) if fmt == "text" else json.render(None, rec)
    if dataset_size is None:  # the dataset size given to tbs profile --dataset-size, if any
        recorded = profile.meta.samples
        dataset_size = int(recorded) if is_number(recorded) and float(recorded) >= 1 else None
    if other_mode is not None:
        if fmt in ("predicted", "trace"):
            raise TbsError(f"format '{fmt}' shows one profile: drop the comparison")
        pair = modes.pair(profile, other_mode, recommendation, other_mode_recommendation)
        return {"html": lambda: modes.render_html(pair, dataset_size), "json": lambda: modes.render_json(pair),
                "csv": lambda: modes.render_csv(pair), "text": lambda: modes.render_text(pair, dataset_size)
                }[fmt]()
    if fmt == "html":
        return html.render(profile, dataset_size, recommendation, top)
    if fmt == "json":
        return json.render(profile, rec)
    if fmt == "csv":
        return profile.summary.to_csv(index=False)
    if fmt == "predicted":
        return predicted_text.render(profile)
    if fmt == "trace":
        return trace.render(profile)
    text = console.render(profile, dataset_size, top, group)
    return text if rec is None else f"{text}\n\n{console.recommendation_text(rec)}"
