"""What a placement is solved from: one batch's per-layer times, prices, tensors, copy costs and memory.

Per-layer times come from the profile (status ok/noisy; failed, OOM or CPU-fallback
cells are infeasible on that device), tensors and bytes from its layer graph,
copy costs from its measured transfer fits; the batch is the one asked for, or the
one ``choose_batch`` picks. ``gather`` builds it, ``check_placeable`` refuses a layer
that no device can take before anything is solved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tbs.backends import BACKENDS, backend
from tbs.cost.reprice import lookup
from tbs.errors import TbsError
from tbs.measure.transfers import TransferFit, fit_line, pair_key
from tbs.place.batch import choose_batch, usable
from tbs.place.graph import bypass, graph_tensors
from tbs.place.memory import MemoryLimits, limits_for
from tbs.place.solvers import INFEASIBLE, Tensor
from tbs.profiles.profile import Profile
from tbs.schema import LOSS_LAYER, MEASURED
from tbs.units import format_seconds, is_number


@dataclass
class PlacementData:
    """Everything the optimiser placed from (times, prices, tensors, memory), so anyone can check the answer.

    Not the model's inputs: the placement problem's data (``Recommendation.data``; JSON ``inputs``).
    """

    batch_size: int
    layers: list[str]
    devices: list[str]
    host: str
    seconds: dict[tuple[str, str], float]
    usd_per_hour: dict[str, float | None]
    tensors: list[Tensor]
    fits: dict[str, TransferFit]
    mode: str = "inference"
    memory: MemoryLimits | None = None  # device memory as a hard limit (None: no sizes known)
    # Why a (layer, device) cannot be placed, where it cannot: what the user is told when nothing fits.
    why_not: dict[tuple[str, str], str] = field(default_factory=dict)
    # Set when no --batch was given and larger profiled batches were passed over (choose_batch): printed.
    batch_note: str = ""
    # Per device, one program call's dispatch (the whole model's single blocked call less its looped call), where
    # it was measured at this batch. Inference only: a split train step runs as its backend's own sequence of calls.
    dispatch_seconds: dict[str, float] = field(default_factory=dict)
    call_per_segment: bool = False  # a split is one call per run of layers on one device (JAX), else one call
    dispatch_note: str = ""  # what dispatch the placement prices, and where it is unknown: printed
    # Each measured (layer, device)'s median 95% confidence interval (seconds): how far a saving could be noise.
    intervals: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def program_starts(self, placement: dict[str, str]) -> list[str]:
        """The layers that start a program call: the first, and, where a split is a call per run of layers on one
        device, each whose device differs from the layer's before it in call order."""
        if not self.layers:
            return []
        starts = [self.layers[0]]
        if self.call_per_segment:
            starts += [l for prev, l in zip(self.layers, self.layers[1:]) if placement[l] != placement[prev]]
        return starts

    def dispatch_of(self, placement: dict[str, str]) -> dict[str, float]:
        """Per layer that starts a program call, its device's dispatch in seconds (unknown: not priced)."""
        return {l: self.dispatch_seconds.get(placement[l], 0.0) for l in self.program_starts(placement)}

    def order_tensors(self) -> list[Tensor]:
        """Zero-byte links between consecutive calls, where crossing devices starts a program (call per segment)."""
        if not (self.call_per_segment and self.dispatch_seconds):
            return []
        return [Tensor(prev, (layer,), 0, order=True) for prev, layer in zip(self.layers, self.layers[1:])]

    def transfer_seconds(self, src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        fit = self.fits.get(pair_key(src, dst))
        return INFEASIBLE if fit is None else fit.seconds(nbytes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "batch_size": self.batch_size, "host": self.host, "devices": self.devices,
            "usd_per_hour": self.usd_per_hour,
            "layer_seconds": {l: {d: (None if not math.isfinite(self.seconds[(l, d)]) else self.seconds[(l, d)])
                                  for d in self.devices} for l in self.layers},
            "tensors": [{"src": t.src, "consumers": list(t.consumers), "bytes": t.bytes,
                         **({"grad": True} if t.grad else {})} for t in self.tensors],
            "transfer_fits": {k: f.as_dict() for k, f in self.fits.items()},
            "dispatch_seconds": self.dispatch_seconds, "call_per_segment": self.call_per_segment,
        }


def _times(rows: pd.DataFrame, layers: list[str], devices: list[str], predicted: set[str]
           ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], str], dict[tuple[str, str], tuple]]:
    """Each (layer, device)'s time at the batch, why the ones without a usable time have none, and each measured
    time's confidence interval (a predicted one has a band instead: ``band_dependence``)."""
    seconds = {(l, d): INFEASIBLE for l in layers for d in devices}
    why_not = {(l, d): "not predicted" if d in predicted else "not measured" for l in layers for d in devices}
    intervals = {}
    for r, timed in zip(rows.itertuples(index=False), usable(rows)):
        if timed:
            seconds[(r.layer, r.device)] = float(r.median_s)
            why_not.pop((r.layer, r.device), None)
            low, high = (float(getattr(r, c, math.nan)) for c in ("ci_low_s", "ci_high_s"))
            if r.device not in predicted and low <= float(r.median_s) <= high:  # NaN: no interval
                intervals[(r.layer, r.device)] = (low, high)
        else:
            reason = r.reason if isinstance(r.reason, str) and r.reason else "no time"
            why_not[(r.layer, r.device)] = reason if r.status in MEASURED else f"{r.status}: {reason}"
    return seconds, why_not, intervals


def gather(profile: Profile, batch_size: int | None) -> PlacementData:
    summary = profile.summary
    if summary.empty:
        raise TbsError(f"'{profile.directory}' has no measured layers")
    records = profile.layers
    layers = [l.name for l in records if l.in_step is not False]  # what the compiled step never runs: no node
    skipped = [l.name for l in records if l.in_step is False]
    if profile.mode == "training" and LOSS_LAYER not in layers and (summary["layer"] == LOSS_LAYER).any():
        layers.append(LOSS_LAYER)  # the loss is placed like a layer
    batches = sorted({int(b) for b in summary["batch_size"]})
    batch, batch_note = (batch_size, "") if batch_size is not None else choose_batch(summary, layers)
    if batch not in batches:
        raise TbsError(f"batch size {batch} (--batch) is not in this profile: it has {', '.join(map(str, batches))}")
    rows = summary[summary["batch_size"] == batch]
    devices = sorted(rows["device"].unique())
    predicted = set(profile.meta.predicted_devices)
    seconds, why_not, intervals = _times(rows, layers, devices, predicted)
    kinds = dict(zip(rows["device"], rows["device_kind"]))
    prices = profile.meta.prices_usd_per_hour
    usd = {d: (float(p) if is_number(p) else None) for d, p in
           rows.groupby("device")["usd_per_hour"].first().items()} if "usd_per_hour" in rows else {}
    for d in devices:
        if usd.get(d) is None:  # a predicted device takes no price from the kind of a measured one
            usd[d] = lookup(prices, d, None if d in predicted else kinds.get(d, ""))
    host = profile.meta.host_device or next((d for d in devices if kinds.get(d) == "cpu"), devices[0])
    edges = profile.meta.graph.get(str(batch), [])
    tensors = graph_tensors(bypass(edges, skipped), layers, profile.mode)
    fits = {k: TransferFit.of(v) for k, v in profile.meta.transfers.items()}
    fits.update(_timed_fits(profile, fits))
    memory = limits_for(profile, rows, batch)
    for l in layers:
        for d in devices:
            if not memory.fits_alone(l, d):  # its weights and activations alone exceed the device
                seconds[(l, d)] = INFEASIBLE
                why_not[(l, d)] = "its weights and activations do not fit in the device's memory"
    dispatch, call_per_segment, note = _dispatch(profile, batch, devices, host, predicted)
    return PlacementData(batch, layers, devices, host, seconds, usd, tensors, fits, profile.mode, memory, why_not,
                         batch_note, dispatch, call_per_segment, note, intervals)


def _timed_fits(profile: Profile, fits: dict[str, TransferFit]) -> dict[str, TransferFit]:
    """The pairs whose fit has no per-size points (written before they were kept) read again from the raw copies
    the profile kept, so their copies are priced through the timed sizes, not through the line."""
    copies = profile.transfers
    if copies is None or copies.empty:
        return {}
    return {key: fit_line(list(g["bytes"]), list(g["seconds"])) for (src, dst), g in copies.groupby(["src", "dst"])
            if (key := pair_key(str(src), str(dst))) in fits and not fits[key].points}


def _dispatch(profile: Profile, batch: int, devices: list[str], host: str, predicted: set[str]
              ) -> tuple[dict[str, float], bool, str]:
    """Each device's measured dispatch per program call at ``batch``, whether a split calls one program per run of
    layers on one device (the profile's backend), and the note saying what is priced and what is not.

    A predicted device is assumed to dispatch as the host does (its calls start there; a GPU adds its launch and
    its sync): a floor, so that a device never run looks no cheaper to call than the one that calls it."""
    model = profile.model
    if profile.mode == "training" or model is None or model.empty or "dispatch_overhead_s" not in model:
        return {}, False, ""
    rows = model[(pd.to_numeric(model["batch_size"], errors="coerce") == batch) & model["device"].isin(devices)]
    found = {str(d): float(v) for d, v in zip(rows["device"], pd.to_numeric(rows["dispatch_overhead_s"],
                                                                            errors="coerce")) if math.isfinite(v)}
    if not found:
        return {}, False, ""
    per_segment = backend(profile.backend).call_per_segment if profile.backend in BACKENDS else False
    calls = ("one program call per run of consecutive layers on one device" if per_segment
             else "one program call for the whole placement")
    measured = ", ".join(f"{d} {format_seconds(v)}" for d, v in sorted(found.items()))
    note = f"Each program call's dispatch is included ({calls}; measured per call: {measured})"
    assumed = sorted(d for d in devices if d in predicted and d not in found and host in found)
    if assumed:
        note += f"; assumed on {', '.join(assumed)} (predicted): the host {host}'s, a floor"
        found.update({d: found[host] for d in assumed})
    missing = [d for d in devices if d not in found]
    if missing:
        note += f"; not priced on {', '.join(missing)} (no whole-model call timed there)"
    return found, per_segment, note


def check_placeable(inp: PlacementData, objective: str) -> None:
    """Every layer needs a device that can run it (and, to minimise cost, a priced one): else one line naming it."""
    for layer in inp.layers:
        runs_on = [d for d in inp.devices if math.isfinite(inp.seconds[(layer, d)])]
        if not runs_on:
            why = "; ".join(f"{d}: {inp.why_not.get((layer, d), 'not measured')}" for d in inp.devices)
            raise TbsError(f"layer '{layer}' cannot be placed at batch {inp.batch_size}: no profiled device ran it "
                           f"({why}); fix the layer, or profile a device that runs it and recommend again")
        if objective == "cost" and not any(inp.usd_per_hour.get(d) is not None for d in runs_on):
            raise TbsError(f"layer '{layer}' runs only on {', '.join(runs_on)}, which has no price: give one with "
                           f"--cost (e.g. --cost {runs_on[0]}=0.5), or minimise time (--objective time)")

