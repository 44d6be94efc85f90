"""What two profiles' numbers mean: settings that forbid comparing them, and what the header must say.

A refusal is a setting that changes what every number means (the mode, the backend, XLA, the
inputs' shapes, dtypes or kind, the loss or optimizer of a training profile): two such profiles
differ by design, not by the change under review. Everything else that differs (the machine, the
model file, the prices, the data file, the tbs version) is compared, and said in the header.
"""

from __future__ import annotations

from typing import Any

from tbs.profiles.profile import Profile
from tbs.schema import SYNTHETIC_INPUT


def _inputs(profile: Profile) -> list[tuple[Any, Any]]:
    """The model inputs' (shape, dtype) in order; their names are Keras's and may be auto-numbered."""
    return [(tuple(entry.get("shape") or ()), entry.get("dtype")) for entry in profile.meta.inputs
            if isinstance(entry, dict)]


def _input_kind(profile: Profile) -> str | None:
    source = profile.meta.input_source
    if not source:
        return None
    return "synthetic inputs" if str(source).startswith(SYNTHETIC_INPUT) else "your data"


def _trained_with(profile: Profile, part: str) -> str | None:
    entry = profile.meta.training.get(part)
    return entry.get("name") if isinstance(entry, dict) else None


def _describe_inputs(inputs: list[tuple[Any, Any]]) -> str:
    return ", ".join(f"{list(shape)} {dtype}" for shape, dtype in inputs) or "none recorded"


def mismatches(base: Profile, new: Profile) -> list[str]:
    """Each setting that makes the two profiles' numbers mean different things, as a phrase."""
    found = []
    if base.mode != new.mode:
        found.append(f"mode: BASE is {base.mode}, NEW is {new.mode}")
    if base.backend != new.backend:
        found.append(f"backend: BASE ran on {base.backend}, NEW on {new.backend}")
    elif base.meta.xla is not None and new.meta.xla is not None and bool(base.meta.xla) != bool(new.meta.xla):
        found.append(f"xla: BASE {'with' if base.meta.xla else 'without'} XLA, NEW {'with' if new.meta.xla else 'without'}")
    mine, theirs = _inputs(base), _inputs(new)
    if mine and theirs and mine != theirs:
        found.append(f"input: BASE {_describe_inputs(mine)}, NEW {_describe_inputs(theirs)}")
    kinds = _input_kind(base), _input_kind(new)
    if None not in kinds and kinds[0] != kinds[1]:
        found.append(f"input: BASE measured on {kinds[0]}, NEW on {kinds[1]}")
    if base.mode == new.mode == "training":
        for part in ("loss", "optimizer"):
            a, b = _trained_with(base, part), _trained_with(new, part)
            if a is not None and b is not None and a != b:
                found.append(f"{part}: BASE trained with {a}, NEW with {b}")
    return found


def refusal(base: Profile, new: Profile, found: list[str]) -> str:
    """The one line a refused diff prints."""
    return (f"'{base.directory}' and '{new.directory}' were measured with different settings ({'; '.join(found)}): "
            f"their numbers do not compare; diff profiles measured alike, or add --force (force=True) to compare anyway")


def _device_descriptions(profile: Profile) -> dict[str, str]:
    return {str(d.get("name")): str(d.get("description") or "") for d in profile.meta.devices if isinstance(d, dict)}


def _machine(profile: Profile) -> str:
    host = profile.meta.host
    cpu = host.get("cpu_model")
    return f"host {host.get('hostname', '?')}" + (f" ({cpu}, {host.get('cpu_count')} cores)" if cpu else "")


def machine_notes(base: Profile, new: Profile, devices: list[str]) -> tuple[bool, list[str]]:
    """(whether the common devices are different hardware, the lines that say how)."""
    mine, theirs = _device_descriptions(base), _device_descriptions(new)
    differ = [f"{d} is '{mine[d]}' in BASE and '{theirs[d]}' in NEW" for d in devices
              if mine.get(d) and theirs.get(d) and mine[d] != theirs[d]]
    cpu_a, cpu_b = base.meta.host.get("cpu_model"), new.meta.host.get("cpu_model")
    other_cpu = bool(cpu_a and cpu_b and cpu_a != cpu_b)
    if differ or other_cpu:
        lines = [f"Different machines: BASE on {_machine(base)}, NEW on {_machine(new)}; this compares devices, "
                 f"not versions"]
        return True, lines + differ
    if base.hostname != new.hostname:
        return False, [f"Measured on different hosts with the same hardware: BASE on {_machine(base)}, NEW on "
                       f"{_machine(new)}"]
    return False, []


def other_notes(base: Profile, new: Profile, forced: list[str]) -> list[str]:
    """The model, prices, data and tbs versions where they differ; what --force let through."""
    notes = [f"Compared despite different settings (--force): {'; '.join(forced)}"] if forced else []
    a, b = base.meta.model, new.meta.model
    if a.get("sha256") and a.get("sha256") == b.get("sha256"):
        notes.append(f"Same model file (sha256 {str(a['sha256'])[:12]}): any change is the run's or the machine's, "
                     f"not the model's")
    elif a.get("name") != b.get("name"):
        notes.append(f"Models: BASE {a.get('name')!r}, NEW {b.get('name')!r}")
    prices_a, prices_b = base.meta.prices_usd_per_hour, new.meta.prices_usd_per_hour
    repriced = sorted(d for d in set(prices_a) & set(prices_b) if prices_a[d] != prices_b[d])
    if repriced:
        notes.append("Prices differ (" + ", ".join(f"{d} ${prices_a[d]}/h -> ${prices_b[d]}/h" for d in repriced)
                     + "): the cost change includes them; --cost prices both sides alike")
    if _input_kind(base) == _input_kind(new) == "your data" and base.meta.input_source != new.meta.input_source:
        notes.append(f"Input data: BASE {base.meta.input_source}, NEW {new.meta.input_source}")
    for side, p in (("BASE", base), ("NEW", new)):
        if not p.complete:
            notes.append(f"{side} is {p.meta.status or 'unfinished'}: cells it lacks are listed as only in the other")
    return notes
