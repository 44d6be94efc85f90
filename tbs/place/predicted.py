"""Predicted devices in a placement, only when the user asks: labelled, with their assumed links.

A predicted cell is a roofline scaling, not a measurement, so by default ``recommend``
ignores ``profile.predictions`` and says so. With ``include_predicted`` the predicted layer
times join the measured ones as candidates, and each predicted device is linked to the
profile's host device by an assumed link (no copy to it was ever timed: a GPU's as tbs timed a real
GPU machine's, any other a PCIe-class one); the recommendation names the predicted devices and the
assumption.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pandas as pd

from tbs.errors import TbsError
from tbs.measure.transfers import fit_line, pair_key
from tbs.profiles.profile import Profile
from tbs.schema import Status

# Host <-> accelerator copies for a device tbs never saw: PCIe 4.0 x16-class (about 25 GB/s
# achieved) plus a fixed 10 µs per copy. Stated in every recommendation that uses it.
ASSUMED_LINK = {"alpha_s": 10e-6, "beta_s_per_byte": 1.0 / 25e9}
ASSUMPTION = "host links assumed PCIe 4.0 x16 (25 GB/s + 10 µs per copy), not measured"
# A predicted GPU's copies as tbs timed them on the GPU machine it did run (an H200 host, JAX): per timed size, the
# median over its 12 current inference and training profiles (profiles/h200; tests/test_predict.py recomputes it).
# A framework copies from and into pageable host memory: 5.0 GB/s to the GPU and 1.4 GB/s back from 4 to 32 MB, where
# PCIe's 25 GB/s read 5-13x too fast and moved predicted placements' activations across it too readily.
SIZES_BYTES = (4096.0, 262144.0, 4194304.0, 33554432.0)
GPU_LINK_SECONDS = {"to": (2.1379e-4, 2.4481e-4, 9.689e-4, 6.79256e-3),
                    "from": (4.82935e-5, 5.734e-5, 4.42012e-4, 2.1776366e-2)}
GPU_ASSUMPTION = ("host links to a predicted GPU assumed as tbs timed an H200 machine's (JAX, pageable host memory: "
                  "about 5 GB/s to the GPU, 1.4 GB/s back), not measured on it")


def assumed_link(kind: str, to_device: bool) -> dict:
    """The copy a predicted device of ``kind`` is assumed to have with its host, one direction."""
    if kind != "gpu":
        return dict(ASSUMED_LINK)
    return fit_line(list(SIZES_BYTES), list(GPU_LINK_SECONDS["to" if to_device else "from"])).as_dict()


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


def with_predictions(profile: Profile, time_column: str = "median_s") -> tuple[Profile, str]:
    """The profile with its predicted layer cells as candidates, and the note the recommendation prints.

    ``time_column`` low_s or high_s puts every predicted time at that end of its 90% band.
    """
    names = predicted_devices(profile)
    if not names:
        return profile, ""
    p = profile.predictions
    layers = p[(p["target"] == "layer") & p["device"].isin(names)].copy()
    layers["median_s"] = pd.to_numeric(layers[time_column], errors="coerce")
    layers["status"] = Status.OK.value
    # A cell with no prediction keeps its reason ("not predicted: ..."): recommend leaves it off that device.
    untimed = layers["median_s"].isna()
    layers["reason"] = ("predicted: " + layers["method"].astype(str)).where(
        ~untimed, layers["reason"].where(layers["reason"].notna(), "not predicted"))
    summary = pd.concat([profile.summary, layers[[c for c in layers.columns if c in profile.summary.columns]]],
                        ignore_index=True)
    metadata = dict(profile.metadata)
    host = profile.meta.host_device or next(
        (d for d, k in zip(profile.summary["device"], profile.summary["device_kind"]) if k == "cpu"), None)
    transfers = dict(profile.meta.transfers)
    kinds = dict(zip(layers["device"], layers["device_kind"])) if "device_kind" in layers else {}
    if host is not None:
        metadata["host_device"] = host
        for name in names:
            transfers[pair_key(host, name)] = assumed_link(kinds.get(name, ""), to_device=True)
            transfers[pair_key(name, host)] = assumed_link(kinds.get(name, ""), to_device=False)
    metadata["transfers"] = transfers
    metadata["predicted_devices"] = names  # priced by their own id only, never by a measured kind's price
    said = sorted({GPU_ASSUMPTION if kinds.get(name) == "gpu" else ASSUMPTION for name in names})
    note = f"includes predicted devices ({', '.join(names)}: predicted, not measured); {'; '.join(said)}"
    return replace(profile, summary=summary, metadata=metadata), note


def band_dependence(profile: Profile, placement: dict[str, str],
                    solve: Callable[[Profile], dict[str, str]]) -> list[dict[str, Any]]:
    """Which layers' device rests on a prediction, and whether the 90% band could change it.

    The placement is solved again with every predicted time at the low end of its band and
    at the high end (all together: one device's predictions err together); a layer whose
    device differs in either would flip within the band.
    """
    names = set(predicted_devices(profile))
    ends = {}
    for end in ("low_s", "high_s"):
        try:
            ends[end] = solve(with_predictions(profile, end)[0])
        except TbsError as exc:  # e.g. a latency cap no placement meets at that end
            ends[end] = {"error": str(exc)}
    rows = []
    for layer, device in placement.items():
        flips = {end: chosen.get(layer) for end, chosen in ends.items() if chosen.get(layer, device) != device}
        if device not in names and not flips:
            continue
        rows.append({"layer": layer, "device": device, "device_predicted": device in names,
                     "at_band_low": ends["low_s"].get(layer, ""), "at_band_high": ends["high_s"].get(layer, ""),
                     "could_flip": bool(flips)})
    return rows
