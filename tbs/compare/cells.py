"""The cells two profiles share, side by side: each one's time and cost per sample, the change, a verdict.

A cell is the whole model or one layer on one device at one batch size. Only devices and batch
sizes both profiles measured are compared (the others are listed apart); a layer NEW added or
BASE had and NEW removed is a row with one side. Predicted cells are compared only with predicted
ones, in a table of their own, without a verdict.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd

from tbs.compare import verdict as v
from tbs.compare.layers import ADDED, REMOVED, SAME, named
from tbs.profiles.profile import Profile
from tbs.schema import MODEL_LAYER, USABLE
from tbs.units import is_number

CELL_COLUMNS = [
    "target", "layer", "base_layer", "match", "layer_type", "device", "batch_size", "status_base", "status_new",
    "n_base", "n_new", "base_median_s", "new_median_s", "base_per_sample_s", "new_per_sample_s", "time_change",
    "time_change_low", "time_change_high", "p_value", "confidence", "verdict", "regression",
    "base_cost_per_sample_usd", "new_cost_per_sample_usd", "cost_change",
]
PREDICTED_COLUMNS = [
    "target", "layer", "base_layer", "device", "batch_size", "base_method", "new_method", "base_median_s",
    "base_low_s", "base_high_s", "new_median_s", "new_low_s", "new_high_s", "time_change",
    "base_cost_per_sample_usd", "new_cost_per_sample_usd", "cost_change", "verdict",
]
Samples = dict[tuple[str, str, str, int], dict[str, np.ndarray]]


def devices_of(profile: Profile) -> list[str]:
    names: dict[str, None] = {}
    for frame in (profile.summary, profile.model):
        if len(frame):
            names.update(dict.fromkeys(str(d) for d in frame["device"].dropna()))
    return list(names)


def batches_of(profile: Profile) -> list[int]:
    found = set(profile.batch_sizes)
    for frame in (profile.summary, profile.model):
        if len(frame):
            found.update(int(b) for b in frame["batch_size"].dropna())
    return sorted(found)


def sample_index(profile: Profile) -> Samples:
    """Every cell's raw seconds per call, by phase: (target, layer, device, batch) -> {phase: array}."""
    frame = profile.samples
    out: Samples = {}
    if frame.empty:
        return out
    frame = frame[frame["seconds_per_call"].notna()].assign(phase=frame["phase"].fillna("forward"))
    for (target, layer, device, batch, phase), group in frame.groupby(
            ["target", "layer", "device", "batch_size", "phase"], sort=False):
        out.setdefault((str(target), str(layer), str(device), int(batch)), {})[str(phase)] = (
            group["seconds_per_call"].to_numpy(dtype=float))
    return out


def _rows_by(frame: pd.DataFrame, keys: list[str]) -> dict[tuple, dict[str, Any]]:
    if frame.empty:
        return {}
    records = frame.to_dict("records")
    return {tuple(int(r[k]) if k == "batch_size" else str(r[k]) for k in keys): r for r in records}


def _change(base: Any, new: Any) -> float:
    if is_number(base) and is_number(new) and float(base) > 0:
        return float(new) / float(base) - 1.0
    return np.nan


def _phases(samples: Samples, target: str, row: dict[str, Any], device: str, batch: int) -> dict[str, np.ndarray]:
    """The cell's samples (a deduplicated row's are its representative's), the phases that make its time."""
    shared = row.get("shared_with")
    layer = MODEL_LAYER if target == "model" else shared if isinstance(shared, str) and shared else str(row["layer"])
    return v.row_phases(samples.get((target, layer, device, batch), {}))


def _judged(rb: dict[str, Any], rn: dict[str, Any], pb: dict[str, np.ndarray], pn: dict[str, np.ndarray],
            confidence: float) -> dict[str, Any]:
    """The change and, where both sides have enough samples, its interval and p-value; else why not."""
    ok_b, ok_n = rb.get("status") in USABLE, rn.get("status") in USABLE
    if not (ok_b and ok_n):
        return {"verdict": v.NOT_MEASURED if not (ok_b or ok_n) else v.FAILED if ok_b else v.FIXED}
    base_s, new_s = rb.get("median_s"), rn.get("median_s")
    if not (is_number(base_s) and is_number(new_s)):
        return {"verdict": v.NO_SAMPLES}
    if float(base_s) <= 0 or float(new_s) <= 0:
        return {"verdict": v.BELOW_RESOLUTION}
    if not pb or not pn:
        return {"verdict": v.NO_SAMPLES, "time_change": float(new_s) / float(base_s) - 1.0}
    fewest = min(len(a) for a in (*pb.values(), *pn.values()))
    if fewest < v.MIN_SAMPLES:
        return {"verdict": v.TOO_FEW, "time_change": float(new_s) / float(base_s) - 1.0}
    error = v.log_ratio_error(pb, pn)
    change, low, high, p = v.change_interval(float(base_s), float(new_s), error, confidence, fewest)
    return {"time_change": change, "time_change_low": low, "time_change_high": high, "p_value": p}


def _cell(target: str, layer: str | None, base_layer: str | None, match: str, layer_type: Any, device: str,
          batch: int, rb: dict[str, Any] | None, rn: dict[str, Any] | None, samples: tuple[Samples, Samples],
          confidence: float) -> dict[str, Any]:
    row: dict[str, Any] = dict(target=target, layer=layer if layer is not None else base_layer, base_layer=base_layer,
                               match=match, layer_type=layer_type, device=device, batch_size=batch)
    for side, r in (("base", rb), ("new", rn)):
        if r is not None:
            row.update({f"status_{side}": r.get("status"), f"n_{side}": r.get("n"), f"{side}_median_s": r.get("median_s"),
                        f"{side}_per_sample_s": r.get("per_sample_s"),
                        f"{side}_cost_per_sample_usd": r.get("cost_per_sample_usd")})
    if rb is None or rn is None:
        one_sided = {ADDED: v.ADDED, REMOVED: v.REMOVED}.get(match)
        row["verdict"] = one_sided or (v.ONLY_NEW if rb is None else v.ONLY_BASE)
        return row
    pb = _phases(samples[0], target, rb, device, batch)
    pn = _phases(samples[1], target, rn, device, batch)
    judged = _judged(rb, rn, pb, pn, confidence)
    row.update(judged)
    if "time_change" in judged:  # a cost change only where the times compare (not a 0 below resolution)
        row["cost_change"] = _change(row.get("base_cost_per_sample_usd"), row.get("new_cost_per_sample_usd"))
    return row


def compare_cells(base: Profile, new: Profile, matches: pd.DataFrame, devices: list[str], batches: list[int],
                  confidence: float) -> pd.DataFrame:
    """Every compared cell (the whole model first, then the layers in NEW's order), verdicts pending."""
    samples = (sample_index(base), sample_index(new))
    rows = []
    model_b, model_n = _rows_by(base.model, ["device", "batch_size"]), _rows_by(new.model, ["device", "batch_size"])
    layers_b = _rows_by(base.summary, ["layer", "device", "batch_size"])
    layers_n = _rows_by(new.summary, ["layer", "device", "batch_size"])
    pairs = [(m["base_layer"] if named(m["base_layer"]) else None, m["new_layer"] if named(m["new_layer"]) else None,
              m["match"], m["layer_type"]) for m in matches.to_dict("records")]
    for batch in batches:
        for device in devices:
            rb, rn = model_b.get((device, batch)), model_n.get((device, batch))
            if rb is not None or rn is not None:
                rows.append(_cell("model", MODEL_LAYER, MODEL_LAYER, SAME, None, device, batch, rb, rn, samples,
                                  confidence))
            for b_name, n_name, match, layer_type in pairs:
                rb = layers_b.get((b_name, device, batch)) if b_name else None
                rn = layers_n.get((n_name, device, batch)) if n_name else None
                if rb is not None or rn is not None:
                    rows.append(_cell("layer", n_name, b_name, match, layer_type, device, batch, rb, rn, samples,
                                      confidence))
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def judge(cells: pd.DataFrame, confidence: float, threshold: float) -> pd.DataFrame:
    """Verdicts of every cell tested, their p-values adjusted together; regressions flagged."""
    cells = cells.astype({"verdict": object, "confidence": float, "p_value": float, "time_change": float})
    tested = cells["p_value"].notna()
    q = v.adjusted(cells.loc[tested, "p_value"].astype(float).tolist())
    cells.loc[tested, "confidence"] = [1.0 - x for x in q]
    cells.loc[tested, "verdict"] = [v.verdict(change, x, confidence)
                                    for change, x in zip(cells.loc[tested, "time_change"].astype(float), q)]
    slower = (cells["verdict"] == v.SLOWER) & (cells["time_change"].astype(float) > threshold)
    cells["regression"] = slower | (cells["verdict"] == v.FAILED)
    return cells


def compare_predicted(base: Profile, new: Profile, matches: pd.DataFrame) -> pd.DataFrame:
    """Cells both sides predicted (never against a measured one): the change of two predictions, labelled."""
    keys = ["target", "layer", "device", "batch_size"]
    mine, theirs = _rows_by(base.predictions, keys), _rows_by(new.predictions, keys)
    names = {str(m["new_layer"]): str(m["base_layer"]) for m in matches.to_dict("records")
             if named(m["new_layer"]) and named(m["base_layer"])}
    names[MODEL_LAYER] = MODEL_LAYER
    rows = []
    for (target, layer, device, batch), rn in theirs.items():
        rb = mine.get((target, names.get(layer, layer), device, batch))
        if rb is None or not (is_number(rb.get("median_s")) and is_number(rn.get("median_s"))):
            continue
        rows.append(dict(
            target=target, layer=layer, base_layer=rb["layer"], device=device, batch_size=batch,
            base_method=rb.get("method"), new_method=rn.get("method"), base_median_s=rb["median_s"],
            base_low_s=rb.get("low_s"), base_high_s=rb.get("high_s"), new_median_s=rn["median_s"],
            new_low_s=rn.get("low_s"), new_high_s=rn.get("high_s"), time_change=_change(rb["median_s"], rn["median_s"]),
            base_cost_per_sample_usd=rb.get("cost_per_sample_usd"), new_cost_per_sample_usd=rn.get("cost_per_sample_usd"),
            cost_change=_change(rb.get("cost_per_sample_usd"), rn.get("cost_per_sample_usd")), verdict=v.PREDICTED))
    return pd.DataFrame(rows, columns=PREDICTED_COLUMNS)


def only(mine: Iterable[Any], theirs: Iterable[Any]) -> list[Any]:
    """What the first has and the second lacks, in the first's order."""
    other = set(theirs)
    return [x for x in mine if x not in other]



def common_shift(cells: pd.DataFrame, least: int = 3, agreeing: float = 0.8, size: float = 0.05) -> str | None:
    """A note when the layers all moved together: a machine that was busier (or clocked lower) in one run
    moves every cell, which a change to a model rarely does; None when they did not."""
    tested = cells[(cells["target"] == "layer") & cells["time_change_low"].notna()]  # a bounded interval
    if len(tested) < least:
        return None
    changes = tested["time_change"].astype(float)
    median = float(changes.median())
    # moved with the rest: the same way, by at least half as much (one layer slower leaves the others near 0)
    together = float(((np.sign(changes) == np.sign(median)) & (changes.abs() >= abs(median) / 2)).mean())
    if abs(median) < size or together < agreeing:
        return None
    return (f"Every layer moved together ({together:.0%} of the {len(tested)} layer cells tested, median change "
            f"{median:+.1%}): more likely the machine's load or clock in one run than the change under review; "
            f"profile both on a quiet machine, one after the other")
