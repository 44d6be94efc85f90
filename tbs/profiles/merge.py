"""Merge profiles of one model measured on different machines (or backends) into one Profile.

Devices stay distinct by host and backend: when profiles come from more than one
host, a device is named ``host/device`` everywhere (``gpubox/gpu:0``); when they
come from more than one Keras backend, the backend follows (``cpu:0 (tf)``,
``gpu:0 (jax)``), so one model's layers compare side by side across backends.
Profiles that would give one device label twice (the same directory passed twice,
say) are refused, as are profiles whose numbers do not compare: another mode, another
loss or optimizer in training, or the user's data against synthetic inputs.
``split_by_mode`` groups inference and training profiles first, so a report merges
each mode on its own and compares the two. The merged profile is as finished as its
least finished input, so the report says when one of them is interrupted.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from tbs.backends import short
from tbs.errors import ProfileError
from tbs.profiles.profile import Profile
from tbs.schema import SYNTHETIC_INPUT, ProfileStatus



def _signature(profile: Profile) -> list[tuple]:
    return [(l.name, l.type) for l in profile.layers]


def _check_model(profiles: list[Profile]) -> None:
    """One model only: the same file, or at least the same layers (a re-saved file)."""
    first = profiles[0]
    for other in profiles[1:]:
        same_file = first.meta.model.get("sha256") == other.meta.model.get("sha256")
        if not same_file and _signature(first) != _signature(other):
            raise ProfileError(
                f"'{other.directory}' profiles model '{other.meta.model.get('name')}', "
                f"'{first.directory}' profiles '{first.meta.model.get('name')}': "
                f"a report merges profiles of one model only"
            )


def _trained_with(profile: Profile, part: str) -> str | None:
    """The loss's or the optimizer's name in a training profile (None where not recorded)."""
    entry = profile.meta.training.get(part)
    return entry.get("name") if isinstance(entry, dict) else None


def _check_settings(profiles: list[Profile]) -> None:
    """Numbers taken with different measuring settings do not compare: refuse, naming the setting."""
    first = profiles[0]
    for other in profiles[1:]:
        pairs = [("mode", first.mode, other.mode)]
        if first.backend == other.backend:  # across backends the compiler differs by nature
            pairs.append(("xla", first.meta.xla, other.meta.xla))
        if first.mode == other.mode == "training":  # an update's cost is the optimizer's, a loss row the loss's
            pairs += [(part, _trained_with(first, part), _trained_with(other, part)) for part in ("optimizer", "loss")]
        for setting, mine, theirs in pairs:
            if mine is not None and theirs is not None and mine != theirs:
                raise ProfileError(
                    f"'{other.directory}' was measured with {setting} {theirs!r} and '{first.directory}' with "
                    f"{mine!r}: their numbers do not compare; merge profiles measured with the same {setting}"
                )


def _input_kind(profile: Profile) -> str | None:
    """'synthetic' or 'your data' (paths and seeds may differ between machines); None if not recorded."""
    source = profile.meta.input_source
    if not source:
        return None
    return "synthetic inputs" if str(source).startswith(SYNTHETIC_INPUT) else "user data"


def _check_input_source(profiles: list[Profile]) -> None:
    """A layer's time can depend on its data (text length, sparsity): synthetic and real do not compare."""
    first = profiles[0]
    for other in profiles[1:]:
        mine, theirs = _input_kind(first), _input_kind(other)
        if mine is not None and theirs is not None and mine != theirs:
            raise ProfileError(
                f"'{other.directory}' was measured on {theirs} (input_source {other.meta.input_source!r}) and "
                f"'{first.directory}' on {mine} ({first.meta.input_source!r}): their numbers do not compare; "
                f"merge profiles whose input_source is of one kind (all with --input, or all without)"
            )


def _device_names(profile: Profile) -> set[str]:
    """Every device a profile has rows or metadata for."""
    names = set(profile.devices)
    for frame in (profile.summary, profile.model):
        if len(frame):
            names.update(str(d) for d in frame["device"].dropna())
    return names


def machine_names(profiles: list[Profile]) -> list[str]:
    """Each profile's machine, by its hostname; where one hostname names machines whose records differ (CPU,
    core count, platform: two cloud VMs both called 'vm', a GPU machine and a laptop), ``name-2``, ``name-3``...
    in the order given."""
    seen: dict[str, list[tuple]] = {}
    names = []
    for p in profiles:
        record = tuple(str(p.meta.host.get(k)) for k in ("cpu_model", "cpu_count", "platform"))
        machines = seen.setdefault(p.hostname, [])
        if record not in machines and (set(record) != {"None"} or not machines):  # no record: the first one's
            machines.append(record)
        index = machines.index(record) if record in machines else 0
        names.append(p.hostname if index == 0 else f"{p.hostname}-{index + 1}")
    return names


def _check_distinct(profiles: list[Profile]) -> None:
    """Refuse two profiles of one device on one machine and backend: merged, their rows would share a label."""
    seen: dict[tuple[str, str, str], Profile] = {}
    for p, machine in zip(profiles, machine_names(profiles)):
        for device in sorted(_device_names(p)):
            key = (machine, p.backend, device)
            if key in seen:
                raise ProfileError(
                    f"'{seen[key].directory}' and '{p.directory}' both measured {device} on host {machine} "
                    f"with {p.backend}: merged, their rows would share one device; pass each directory once, "
                    f"and merge profiles of different machines or backends"
                )
            seen[key] = p


def _merged_status(profiles: list[Profile]) -> str:
    """The first input's status that is not complete ('interrupted', ...), else complete."""
    for p in profiles:
        status = p.meta.status
        if status is not None and status != ProfileStatus.COMPLETE:
            return str(status)
    return ProfileStatus.COMPLETE.value


MODES = ("inference", "training")


def split_by_mode(profiles: list[Profile]) -> dict[str, list[Profile]]:
    """Profiles grouped by mode (inference first), each group in the order given.

    ``tbs report`` merges each group on its own (``merge_profiles`` refuses mixed
    modes) and, given both, renders inference against training.
    """
    groups: dict[str, list[Profile]] = {}
    for mode in MODES + tuple(sorted({p.mode for p in profiles} - set(MODES))):
        chosen = [p for p in profiles if p.mode == mode]
        if chosen:
            groups[mode] = chosen
    return groups


def merge_each_mode(profiles: list[Profile]) -> tuple[Profile, Profile | None]:
    """The profile to report and the one to compare it with: training against inference when both are given.

    With one mode, its profiles merged and None; with both, (training, inference), each merged.
    """
    groups = split_by_mode(profiles)
    merged = {mode: merge_profiles(group) for mode, group in groups.items()}
    if len(merged) > 2 or (len(merged) == 2 and set(merged) != set(MODES)):
        raise ProfileError(f"profiles of modes {', '.join(merged)}: a report compares inference with training only")
    if len(merged) == 2:
        return merged["training"], merged["inference"]
    if not merged:
        raise ProfileError("no profile given")
    return next(iter(merged.values())), None


def merge_profiles(profiles: list[Profile]) -> Profile:
    """One profile holding every device of every input profile (same model required)."""
    if not profiles:
        raise ProfileError("no profile given")
    first = profiles[0]
    _check_model(profiles)
    _check_settings(profiles)
    _check_input_source(profiles)
    if len(profiles) == 1:
        return first
    _check_distinct(profiles)
    machine = dict(zip(map(id, profiles), machine_names(profiles)))
    hosts = set(machine.values())
    backends = {p.backend for p in profiles}

    def label(p: Profile, device: str) -> str:
        name = f"{machine[id(p)]}/{device}" if len(hosts) > 1 else device
        return f"{name} ({short(p.backend)})" if len(backends) > 1 else name

    frames: dict[str, list[pd.DataFrame]] = {"summary": [], "model": [], "samples": [], "analysis": [],
                                             "predictions": [], "ops": []}
    devices, missing, environments = [], {}, []
    per_device: dict[str, dict[str, Any]] = {"calibration": {}, "capacity": {}}
    for p in profiles:
        for name in frames:
            frame = getattr(p, name).copy()
            column = "predicted_from" if name == "predictions" else "device"  # a predicted device keeps its id
            if len(frame):
                frame[column] = [label(p, d) for d in frame[column]]
            frames[name].append(frame)
        for key, found in per_device.items():
            found.update({label(p, d): v for d, v in getattr(p.meta, key).items()})
        devices += [dict(d, name=label(p, d["name"]), host=machine[id(p)]) for d in p.meta.devices]
        for kind, reason in p.meta.devices_missing.items():
            missing[label(p, kind)] = reason
        environments.append({k: p.meta.recorded(k) for k in ("host", "versions", "settings", "command", "started",
                                                              "backend", "status")})
    metadata = dict(first.metadata, **per_device, devices=devices, devices_missing=missing, environments=environments,
                    merged_from=[str(p.directory) for p in profiles], status=_merged_status(profiles),
                    kernel_rules=min(p.meta.kernel_rules or 1 for p in profiles),  # the oldest reading of any
                    batch_sizes=sorted({b for p in profiles for b in p.meta.batch_sizes}))
    return Profile(directory=first.directory, metadata=metadata,
                   **{name: pd.concat([f for f in parts if len(f)] or parts[:1], ignore_index=True)
                      for name, parts in frames.items()})
