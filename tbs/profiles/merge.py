"""Merge profiles of one model measured on different machines (or backends) into one Profile.

Devices stay distinct by host and backend: when profiles come from more than one
host, a device is named ``host/device`` everywhere (``gpubox/gpu:0``); when they
come from more than one Keras backend, the backend follows (``cpu:0 (tf)``,
``gpu:0 (jax)``), so one model's layers compare side by side across backends.
"""

from __future__ import annotations

import pandas as pd

from tbs.backends import short
from tbs.errors import ProfileError
from tbs.profiles.profile import Profile
from tbs.schema import MERGE_SETTINGS


def _signature(profile: Profile) -> list[tuple]:
    return [(l["name"], l["type"]) for l in profile.metadata.get("layers", [])]


def _host(profile: Profile) -> str:
    return str(profile.metadata.get("host", {}).get("hostname", "host"))


def _backend(profile: Profile) -> str:
    return str(profile.metadata.get("backend") or "tensorflow")


def _check_settings(profiles: list[Profile]) -> None:
    """Numbers taken with different measuring settings do not compare: refuse, naming the setting."""
    first = profiles[0]
    for other in profiles[1:]:
        same_backend = _backend(first) == _backend(other)
        for setting in MERGE_SETTINGS + (("xla",) if same_backend else ()):  # across backends XLA differs by nature
            mine, theirs = first.metadata.get(setting), other.metadata.get(setting)
            if setting == "mode":
                mine, theirs = mine or "inference", theirs or "inference"
            if mine is not None and theirs is not None and mine != theirs:
                raise ProfileError(
                    f"'{other.directory}' was measured with {setting} {theirs!r} and '{first.directory}' with "
                    f"{mine!r}: their numbers do not compare; merge profiles measured with the same {setting}"
                )


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
    _check_settings(profiles)
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
