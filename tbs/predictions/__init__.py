"""Predictions for devices tbs did not measure: a GPU from a CPU profile by the GPU model fitted on published
measurements (gpu_predict), any other device by a roofline over the compiler's analysis and the catalog.

``predict`` returns the profile with ``predictions`` filled for the catalog devices asked
for; measured cells are never touched, and nothing predicted enters ``summary``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import pandas as pd

from tbs.errors import TbsError
from tbs.predictions.catalog import CatalogDevice, load_catalog, resolve
from tbs.predictions.predictor import fitted_achievable, predict_rows
from tbs.profiles.profile import Profile
from tbs.columns import PREDICTION_COLUMNS

__all__ = ["predict", "load_catalog", "CatalogDevice"]


def choose_source(profile: Profile, target: CatalogDevice, source: str | None) -> str:
    """The measured device a prediction scales from: the one asked for, else one of the target's kind, else a CPU."""
    calibrated = [d for d in profile.devices if d in profile.meta.calibration]
    if source is not None:
        if source not in profile.devices:
            raise TbsError(f"--from: '{source}' was not measured in this profile; choose from {', '.join(profile.devices)}")
        return source
    if not calibrated:
        raise TbsError("this profile has no device calibration (profiled with --no-analysis, or before tbs 0.4): "
                       "run tbs profile without --no-analysis to predict from it")
    kinds = {d["name"]: d.get("kind") for d in profile.meta.devices}
    return next((d for d in calibrated if kinds.get(d) == target.kind), None) or \
        next((d for d in calibrated if kinds.get(d) == "cpu"), calibrated[0])


def predict(profile: Profile, devices: str | Iterable[str], source: str | None = None,
            catalog_path: str | None = None) -> Profile:
    """``profile`` with predicted cells for the catalog ``devices`` (replacing earlier predictions for them)."""
    catalog = load_catalog(catalog_path)
    targets = resolve(devices, catalog)
    measured = set(profile.devices)
    clash = [t.id for t in targets if t.id in measured]
    if clash:
        raise TbsError(f"--device: {', '.join(clash)} was measured in this profile; predictions are for devices it lacks")
    achievable, how = fitted_achievable(profile, catalog)
    rows = []
    for target in targets:
        rows += predict_rows(profile, target, choose_source(profile, target, source), achievable)
    new = pd.DataFrame(rows, columns=PREDICTION_COLUMNS)  # priced by the cost stage (tbs.cost.reprice)
    old = profile.predictions
    kept = old[~old["device"].isin([t.id for t in targets])] if len(old) else old
    frame = pd.concat([f for f in (kept, new) if len(f)], ignore_index=True) if len(kept) else new
    metadata = dict(profile.metadata)
    metadata["prediction"] = {"achievable_fraction": achievable, "achievable_source": how,
                              "catalog": catalog_path or "tbs/predictions/catalog.csv",
                              "devices": {t.id: {"name": t.name, "unit": t.unit, "price": t.price,
                                                 "memory_bytes": t.memory_bytes} for t in targets}}
    return replace(profile, predictions=frame[PREDICTION_COLUMNS], metadata=metadata)
