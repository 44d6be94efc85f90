"""A placement recommendation, the result object: the chosen placement against every single device,
the per-layer argmin and the cost-latency frontier, and the per-layer and per-sample views of it.

Renderers read it (``layer_rows``, ``saving``, ``comparison``); nothing here solves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tbs.cost.reprice import usd_per_batch
from tbs.place.data import PlacementData
from tbs.endpoints import is_input_endpoint


TRAINING_NOTE = ("training: forward, backward and update of each layer on one device; "
                 "activations move forward and gradients back")


@dataclass
class Evaluation:
    name: str
    placement: dict[str, str]
    seconds_per_batch: float
    usd_per_batch: float | None

    def per_sample(self, batch: int) -> dict[str, float | None]:
        return {"seconds_per_sample": self.seconds_per_batch / batch,
                "usd_per_sample": None if self.usd_per_batch is None else self.usd_per_batch / batch,
                "usd_per_1m_samples": None if self.usd_per_batch is None else self.usd_per_batch / batch * 1e6}


@dataclass
class Recommendation:
    objective: str
    billing: str
    data: PlacementData  # what the solvers placed from (was ``inputs``: still readable by that name)
    chosen: Evaluation
    method: str
    single_devices: list[Evaluation]
    argmin: Evaluation | None
    frontier: list[Evaluation] = field(default_factory=list)
    verification: Any = None  # a verify.Verification once the placement has been run for real
    # Whether predicted (not measured) devices took part, or were left out: every output prints it.
    predicted_note: str = ""
    # With predicted devices: per layer placed on one, or that the band could move (place.predicted.band_dependence).
    prediction_dependence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def inputs(self) -> PlacementData:
        """The old name of ``data``."""
        return self.data

    @inputs.setter
    def inputs(self, data: PlacementData) -> None:
        self.data = data

    @property
    def batch_size(self) -> int:
        return self.data.batch_size

    @property
    def mode(self) -> str:
        return self.data.mode

    @property
    def mode_note(self) -> str:
        """What one placed layer stands for in this mode (the reports print it)."""
        if self.mode == "training":
            return TRAINING_NOTE
        return "inference: each layer's forward pass on one device; activations move forward"

    @property
    def placement(self) -> pd.DataFrame:
        """One row per layer: its device, predicted time and cost per sample, and the copies it waits for."""
        columns = ["layer", "device", "seconds_per_sample", "usd_per_sample", "transfer_in_seconds_per_sample",
                   "dispatch_seconds_per_sample"]
        if self.mode == "training":
            columns.append("gradient_in_seconds_per_sample")
        return pd.DataFrame(layer_rows(self), columns=columns)

    @property
    def comparison(self) -> pd.DataFrame:
        """The recommendation against every single device and per-layer argmin, per sample."""
        return pd.DataFrame(comparison(self))

    def __repr__(self) -> str:
        return (f"<tbs.Recommendation batch {self.batch_size}, minimise {self.objective} ({self.billing}): "
                f"{len(set(self.chosen.placement.values()))} device(s), {self.method}>")


def _copies_in(inp: PlacementData, placement: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per layer, seconds of activations copied in (once per tensor and device) and of gradients sent back to it."""
    forward = {layer: 0.0 for layer in inp.layers}
    backward = {layer: 0.0 for layer in inp.layers}
    order = {layer: i for i, layer in enumerate(inp.layers)}
    for t in inp.tensors:
        src = inp.host if is_input_endpoint(t.src) else placement[t.src]
        first_reader: dict[str, str] = {}
        for c in sorted((c for c in t.consumers if c in order), key=order.get):
            first_reader.setdefault(placement[c], c)
        for device, reader in first_reader.items():
            if device == src:
                continue
            if t.grad and t.src in backward:  # the producer waits for its gradient
                backward[t.src] += inp.transfer_seconds(device, src, t.bytes)
            elif not t.grad:  # the first reader on a device waits for the copy there
                forward[reader] += inp.transfer_seconds(src, device, t.bytes)
    return forward, backward


def layer_rows(rec: Recommendation) -> list[dict[str, Any]]:
    """Per layer: device, predicted seconds and USD per sample, the copies it waits for and the program call it
    starts (its device's dispatch, where the layer starts one), per sample."""
    inp, placement, batch = rec.data, rec.chosen.placement, rec.data.batch_size
    forward, backward = _copies_in(inp, placement)
    dispatch = inp.dispatch_of(placement) if inp.dispatch_seconds else {}
    rows = []
    for layer in inp.layers:
        device = placement[layer]
        seconds = inp.seconds[(layer, device)]
        usd = usd_per_batch(seconds, inp.usd_per_hour.get(device))
        row = {"layer": layer, "device": device, "seconds_per_sample": seconds / batch,
               "usd_per_sample": None if usd is None else usd / batch,
               "transfer_in_seconds_per_sample": forward[layer] / batch,
               "dispatch_seconds_per_sample": dispatch.get(layer, 0.0) / batch}
        if inp.mode == "training":
            row["gradient_in_seconds_per_sample"] = backward[layer] / batch
        rows.append(row)
    return rows


def saving(rec: Recommendation) -> dict[str, Any]:
    """The recommendation against the best single device, as a fraction and in USD per 1M samples."""
    key = "usd_per_batch" if rec.objective == "cost" else "seconds_per_batch"
    singles = [e for e in rec.single_devices if getattr(e, key) is not None]
    if not singles:
        return {}
    best = min(singles, key=lambda e: getattr(e, key))
    ours, theirs = getattr(rec.chosen, key), getattr(best, key)
    out = {"best_single_device": best.name, "saving_fraction": (theirs - ours) / theirs if theirs else 0.0}
    if rec.chosen.usd_per_batch is not None and best.usd_per_batch is not None:
        out["saving_usd_per_1m_samples"] = (best.usd_per_batch - rec.chosen.usd_per_batch) / rec.data.batch_size * 1e6
    worst = _saving_at_far_ends(rec, best, ours, theirs)
    if worst is not None:
        out["saving_fraction_at_far_ends"] = worst
    return out


def _saving_at_far_ends(rec: Recommendation, best: Evaluation, ours: float, theirs: float) -> float | None:
    """The saving with each layer the two placements put on different devices at its unfavourable confidence
    limit (slower where the recommendation puts it, faster on the single device): at or under 0, the saving may
    be noise. None where a moved layer has no measured interval (a predicted device: its band is judged apart)."""
    inp = rec.data
    if not theirs or (rec.objective == "cost" and rec.billing != "metered"):
        return None

    def weight(device: str) -> float | None:  # seconds, or USD a second on that device
        return 1.0 if rec.objective == "time" else usd_per_batch(1.0, inp.usd_per_hour.get(device))

    ours_up = theirs_down = 0.0
    for layer in inp.layers:
        mine, single = rec.chosen.placement[layer], best.placement[layer]
        if mine == single:
            continue
        a, b = inp.intervals.get((layer, mine)), inp.intervals.get((layer, single))
        wa, wb = weight(mine), weight(single)
        if a is None or b is None or wa is None or wb is None:
            return None
        ours_up += (a[1] - inp.seconds[(layer, mine)]) * wa
        theirs_down += (inp.seconds[(layer, single)] - b[0]) * wb
    return ((theirs - theirs_down) - (ours + ours_up)) / theirs


def comparison(rec: Recommendation) -> list[dict[str, Any]]:
    """The recommendation against every single device and per-layer argmin, per sample."""
    batch = rec.data.batch_size
    return [dict(name=e.name, **e.per_sample(batch))
            for e in [rec.chosen, *rec.single_devices, *([rec.argmin] if rec.argmin else [])]]

