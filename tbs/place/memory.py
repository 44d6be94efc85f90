"""Device memory as a hard limit on a placement.

A layer cannot run on a device its weights and its batch's activations do not fit in
(that cell is infeasible), and the layers placed on one device must fit there together:
Σ weights (in training also their gradients and optimizer slots) plus the largest
activation any of them holds at once. Sizes come from the profile (parameter counts, the
captured tensors scaled to the batch, training rows' weight and slot bytes); limits from
the devices' memory (the host's RAM for a CPU, the allocator's limit for an accelerator,
the catalog's for a predicted device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tbs.profiles.profile import Profile
from tbs.units import is_number

BYTES_PER_PARAM = 4  # float32 weights: the profile records counts, not dtypes


@dataclass
class MemoryLimits:
    """What each layer keeps on its device, the largest activation at the batch, and each device's memory."""

    weights_bytes: dict[str, float]  # layer -> bytes that stay resident wherever it runs
    activation_bytes: dict[str, float]  # layer -> its inputs and outputs at the batch
    limit_bytes: dict[str, float | None]  # device -> memory (None: unknown, no limit applied)

    def fits_alone(self, layer: str, device: str) -> bool:
        limit = self.limit_bytes.get(device)
        return limit is None or self.weights_bytes.get(layer, 0.0) + self.activation_bytes.get(layer, 0.0) <= limit

    def over(self, placement: dict[str, str]) -> dict[str, float]:
        """Devices whose placed layers do not fit together, with the bytes they would need."""
        need: dict[str, float] = {}
        peak: dict[str, float] = {}
        for layer, device in placement.items():
            need[device] = need.get(device, 0.0) + self.weights_bytes.get(layer, 0.0)
            peak[device] = max(peak.get(device, 0.0), self.activation_bytes.get(layer, 0.0))
        return {d: need[d] + peak[d] for d in need
                if self.limit_bytes.get(d) is not None and need[d] + peak[d] > float(self.limit_bytes[d])}

    def constraints(self, layers: list[str], devices: list[str]) -> list[tuple[dict, dict, float]]:
        """Linear rows, per limited device d and layer l: Σ_k weights_k·x[k,d] + activations_l·x[l,d] <= memory_d.

        Together they say: the weights placed on d, plus the activations of any one layer on d, fit.
        """
        rows = []
        for d in devices:
            limit = self.limit_bytes.get(d)
            if limit is None:
                continue
            weights = {(k, d): self.weights_bytes.get(k, 0.0) for k in layers}
            for l in layers:
                row = dict(weights)
                row[(l, d)] = row[(l, d)] + self.activation_bytes.get(l, 0.0)
                rows.append((row, {}, float(limit)))
        return rows


def _device_memory(profile: Profile) -> dict[str, float | None]:
    limits: dict[str, float | None] = {}
    for device in profile.meta.devices:
        value = device.get("memory_bytes")
        limits[str(device.get("name"))] = float(value) if is_number(value) else None
    for name, device in (profile.meta.prediction.get("devices") or {}).items():
        value = device.get("memory_bytes")
        limits[name] = float(value) if is_number(value) else None
    return limits


def limits_for(profile: Profile, rows: pd.DataFrame, batch: int) -> MemoryLimits:
    """Sizes at ``batch`` (``rows``: the summary rows at that batch) and each device's memory."""
    weights: dict[str, float] = {}
    activations: dict[str, float] = {}
    for layer in profile.layers:
        captured = layer.batch_size or batch
        weights[layer.name] = float(layer.params or 0) * BYTES_PER_PARAM
        scale = batch / float(captured) if captured else 1.0
        activations[layer.name] = (float(layer.input_bytes or 0) + float(layer.output_bytes or 0)) * scale
    if profile.mode == "training" and "weight_bytes" in rows:
        for name, group in rows.groupby("layer"):
            w = pd.to_numeric(group["weight_bytes"], errors="coerce").max()
            slots = pd.to_numeric(group["slot_bytes"], errors="coerce").max()
            if not math.isnan(w):
                weights[str(name)] = 2 * w + (0.0 if math.isnan(slots) else slots)  # weights, gradients, slots
    return MemoryLimits(weights, activations, _device_memory(profile))


def describe(over: dict[str, float], limits: MemoryLimits) -> str:
    return "; ".join(f"{d} needs {need / 2**30:.2f} GiB of {float(limits.limit_bytes[d]) / 2**30:.2f} GiB"
                     for d, need in over.items())


__all__: list[Any] = ["MemoryLimits", "limits_for", "describe"]
