"""Machine-readable output: a profile (with its winners) and a recommendation as JSON text."""

from __future__ import annotations

import json
from typing import Any

from tbs.place.result import Evaluation, Recommendation, layer_rows, saving
from tbs.profiles.profile import Profile, with_layer_sums
from tbs.report.winners import step_check, winners
from tbs.schema import LOSS_LAYER


def _records(frame: Any) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records"))


def profile_dict(profile: Profile) -> dict[str, Any]:
    model = with_layer_sums(profile.summary, profile.model)
    meta = profile.meta
    training = {}
    if profile.mode == "training":  # what was trained, and the whole step against Σ phases + loss
        training = {"training": meta.recorded("training"),
                    "step_check": _records(step_check(profile.summary, model, LOSS_LAYER))}
    return {
        "mode": profile.mode,
        **training,
        **{name: meta.recorded(name) for name in ("model", "devices", "devices_missing", "prices_usd_per_hour")},
        "layers": _records(profile.summary),
        "model_rows": _records(model),
        "fastest": _records(winners(profile.summary, "time")),
        "cheapest": _records(winners(profile.summary, "cost")),
        "calibration": meta.recorded("calibration"),
        "capacity": meta.recorded("capacity"),
        # Cells for devices not measured: apart from "layers" and never ranked with them.
        **({"predicted": _records(profile.predictions), "prediction": meta.recorded("prediction")}
           if len(profile.predictions) else {}),
    }


def _evaluation(e: Evaluation, batch: int) -> dict[str, Any]:
    return {"name": e.name, "placement": e.placement, **e.per_sample(batch)}


def recommendation_dict(rec: Recommendation) -> dict[str, Any]:
    """The answer, the alternatives, and every input the optimiser used (so anyone can check it)."""
    batch = rec.data.batch_size
    out = {
        "objective": rec.objective, "billing": rec.billing, "batch_size": batch, "method": rec.method,
        **({"mode": rec.mode, "mode_note": rec.mode_note} if rec.mode == "training" else {}),
        "layers": layer_rows(rec),
        "recommended": _evaluation(rec.chosen, batch),
        "single_devices": [_evaluation(e, batch) for e in rec.single_devices],
        "per_layer_argmin": _evaluation(rec.argmin, batch) if rec.argmin else None,
        "saving": saving(rec),
        "frontier": [_evaluation(e, batch) for e in rec.frontier],
        "inputs": rec.data.as_dict(),
        **({"predicted": rec.predicted_note} if rec.predicted_note else {}),
        **({"batch_note": rec.data.batch_note} if rec.data.batch_note else {}),
        **({"dispatch_note": rec.data.dispatch_note} if rec.data.dispatch_note else {}),
        **({"prediction_dependence": rec.prediction_dependence} if rec.prediction_dependence else {}),
    }
    if rec.verification is not None:
        ver = rec.verification
        out["verification"] = {"results": _records(ver.table), "placed_right": ver.placed_right,
                               "layers": ver.layers, "verdict": ver.verdict}
    return out


def render(profile: Profile | None = None, recommendation: Recommendation | None = None) -> str:
    """JSON text: the profile, the recommendation, or both (``{"profile": ..., "recommendation": ...}``)."""
    if profile is not None and recommendation is not None:
        payload: dict[str, Any] = {"profile": profile_dict(profile), "recommendation": recommendation_dict(recommendation)}
    elif recommendation is not None:
        payload = recommendation_dict(recommendation)
    else:
        payload = profile_dict(profile) if profile is not None else {}
    return json.dumps(payload, indent=2, default=str)
