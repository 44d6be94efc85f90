"""Merge profiles of one model measured on different machines, and re-price them.

Devices stay distinct by host and backend: when profiles come from more than one
host, a device is named ``host/device`` everywhere (``gpubox/gpu:0``); when they
come from more than one Keras backend, the backend follows (``cpu:0 (tf)``,
``gpu:0 (jax)``), so one model's layers compare side by side across backends.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import pandas as pd

from tbs.backend import short
from tbs.cost import SECONDS_PER_HOUR
from tbs.errors import ProfileError
from tbs.profile import Profile


def _signature(profile: Profile) -> list[tuple]:
    return [(l["name"], l["type"]) for l in profile.metadata.get("layers", [])]


def _host(profile: Profile) -> str:
    return str(profile.metadata.get("host", {}).get("hostname", "host"))


def _backend(profile: Profile) -> str:
    return str(profile.metadata.get("backend") or "tensorflow")


def device_names(label: str) -> list[str]:
    """A merged device label and the names it may be priced by: 'box/gpu:0 (jax)' -> that, 'gpu:0 (jax)', 'gpu:0'."""
    names = [label]
    base = label.rsplit(" (", 1)[0] if label.endswith(")") else label
    for name in (label.split("/")[-1], base, base.split("/")[-1]):
        if name not in names:
            names.append(name)
    return names


def merge_profiles(profiles: list[Profile]) -> Profile:
    """One profile holding every device of every input profile (same model required)."""
    if not profiles:
        raise ProfileError("no profile given")
    first = profiles[0]
    for other in profiles[1:]:
        same_file = first.metadata.get("model", {}).get("sha256") == other.metadata.get("model", {}).get("sha256")
        if not same_file and _signature(first) != _signature(other):
            raise ProfileError(
                f"'{other.directory}' profiles model '{other.metadata.get('model', {}).get('name')}', "
                f"'{first.directory}' profiles '{first.metadata.get('model', {}).get('name')}': "
                f"a report merges profiles of one model only"
            )
    if len(profiles) == 1:
        return first
    hosts = {_host(p) for p in profiles}
    backends = {_backend(p) for p in profiles}

    def label(p: Profile, device: str) -> str:
        name = f"{_host(p)}/{device}" if len(hosts) > 1 else device
        return f"{name} ({short(_backend(p))})" if len(backends) > 1 else name

    frames: dict[str, list[pd.DataFrame]] = {"summary": [], "model": [], "samples": []}
    devices, missing, environments = [], {}, []
    for p in profiles:
        for name in frames:
            frame = getattr(p, name).copy()
            if len(frame):
                frame["device"] = [label(p, d) for d in frame["device"]]
            frames[name].append(frame)
        devices += [dict(d, name=label(p, d["name"]), host=_host(p)) for d in p.metadata.get("devices", [])]
        for kind, reason in p.metadata.get("devices_missing", {}).items():
            missing[label(p, kind)] = reason
        environments.append({k: p.metadata.get(k) for k in ("host", "versions", "settings", "command", "started",
                                                              "backend", "status")})
    metadata = dict(first.metadata, devices=devices, devices_missing=missing, environments=environments,
                    merged_from=[str(p.directory) for p in profiles],
                    batch_sizes=sorted({b for p in profiles for b in p.metadata.get("batch_sizes", [])}))
    return Profile(directory=first.directory, metadata=metadata,
                   **{name: pd.concat([f for f in parts if len(f)] or parts[:1], ignore_index=True)
                      for name, parts in frames.items()})


def reprice(profile: Profile, usd_per_hour: Mapping[str, float], spot: Mapping[str, float] | None = None) -> Profile:
    """Cost columns recomputed from new prices: exact device label, then device name, then kind.

    ``spot`` is a discount fraction per device key (0.7 = 70% off the listed price).
    """
    spot = spot or {}

    def lookup(table: Mapping[str, float], device: str, kind: str) -> float | None:
        for key in device_names(device) + [kind]:
            if key in table:
                return table[key]
        return None

    def apply(frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty:
            return frame
        frame = frame.copy()
        prices = []
        for device, kind in zip(frame["device"], frame["device_kind"]):
            price = lookup(usd_per_hour, device, kind)
            discount = lookup(spot, device, kind) or 0.0
            prices.append(None if price is None else price * (1.0 - discount))
        frame["usd_per_hour"] = pd.Series(prices, index=frame.index, dtype="float64")
        frame["cost_per_sample_usd"] = frame["per_sample_s"] * frame["usd_per_hour"] / SECONDS_PER_HOUR
        return frame

    metadata = dict(profile.metadata, prices_usd_per_hour=dict(usd_per_hour), spot_discount=dict(spot))
    return replace(profile, metadata=metadata, summary=apply(profile.summary), model=apply(profile.model))
