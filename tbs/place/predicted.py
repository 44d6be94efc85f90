"""Predicted devices in a placement, only when the user asks: labelled, with their assumed links.

A predicted cell is a roofline scaling, not a measurement, so by default ``recommend``
ignores ``profile.predictions`` and says so. With ``include_predicted`` the predicted layer
times join the measured ones as candidates, and each predicted device is linked to the
profile's host device by an assumed PCIe-class link (no copy to it was ever timed); the
recommendation names the predicted devices and the assumption.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from tbs.measure.transfers import pair_key
from tbs.profiles.profile import Profile
from tbs.schema import Status

# Host <-> accelerator copies for a device tbs never saw: PCIe 4.0 x16-class (about 25 GB/s
# achieved) plus a fixed 10 µs per copy. Stated in every recommendation that uses it.
ASSUMED_LINK = {"alpha_s": 10e-6, "beta_s_per_byte": 1.0 / 25e9}
ASSUMPTION = "host links assumed PCIe 4.0 x16 (25 GB/s + 10 µs per copy), not measured"


def predicted_devices(profile: Profile) -> list[str]:
    """Devices with predicted layer times in this profile (rows that were not predicted have no time)."""
    p = profile.predictions
    if p is None or p.empty:
        return []
    timed = p[(p["target"] == "layer") & pd.to_numeric(p["median_s"], errors="coerce").notna()]
    return sorted(timed["device"].unique())


def ignored_note(profile: Profile) -> str:
    """What the output says when predictions exist but were not asked for."""
    names = predicted_devices(profile)
    if not names:
        return ""
    return (f"predicted devices left out ({', '.join(names)}): pass --include-predicted "
            f"(include_predicted=True) to place on them")


def with_predictions(profile: Profile) -> tuple[Profile, str]:
    """The profile with its predicted layer cells as candidates, and the note the recommendation prints."""
    names = predicted_devices(profile)
    if not names:
        return profile, ""
    p = profile.predictions
    layers = p[(p["target"] == "layer") & p["device"].isin(names)].copy()
    layers["status"] = Status.OK.value
    layers["reason"] = "predicted: " + layers["method"].astype(str)
    summary = pd.concat([profile.summary, layers[[c for c in layers.columns if c in profile.summary.columns]]],
                        ignore_index=True)
    metadata = dict(profile.metadata)
    host = metadata.get("host_device") or next(
        (d for d, k in zip(profile.summary["device"], profile.summary["device_kind"]) if k == "cpu"), None)
    transfers = dict(metadata.get("transfers") or {})
    if host is not None:
        metadata["host_device"] = host
        for name in names:
            transfers[pair_key(host, name)] = dict(ASSUMED_LINK)
            transfers[pair_key(name, host)] = dict(ASSUMED_LINK)
    metadata["transfers"] = transfers
    metadata["predicted_devices"] = names  # priced by their own id only, never by a measured kind's price
    note = f"includes predicted devices ({', '.join(names)}: roofline scaling, not measured); {ASSUMPTION}"
    return replace(profile, summary=summary, metadata=metadata), note
