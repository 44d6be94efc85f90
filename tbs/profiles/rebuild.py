"""A profile's metadata.json rebuilt from its measured rows, when it is damaged or lost.

The rows are what was measured; the metadata says how. ``--resume`` with the same command
supplies the "how" (the model, inputs, devices, settings); the rows supply what they can
check themselves (their mode, devices, batch sizes, the copy costs) and must agree with it.
What the rows cannot show (the model file's hash, the seed, the timing settings) is taken on
trust, and the rebuilt metadata says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tbs.errors import ProfileError
from tbs.measure.transfers import fit_line, pair_key
from tbs.profiles.csvfiles import read_table
from tbs.columns import MODEL_COLUMNS, SUMMARY_COLUMNS, TRANSFER_COLUMNS
from tbs.schema import Metadata


def rebuilt_metadata(directory: Path, metadata: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """This run's ``metadata`` completed from the rows in ``directory``; refuses rows that contradict it."""
    summary = read_table(directory / "summary.csv", "summary", SUMMARY_COLUMNS)
    model = read_table(directory / "model.csv", "model", MODEL_COLUMNS)
    rows = pd.concat([summary[["device", "device_kind", "batch_size", "mode"]],
                      model[["device", "device_kind", "batch_size", "mode"]]], ignore_index=True)
    modes, run = sorted(set(rows["mode"].dropna())), Metadata.from_dict(metadata)
    if modes and modes != [run.mode]:
        raise ProfileError(f"--resume: the rows in '{directory}' were measured in {' and '.join(modes)} mode, this run "
                           f"measures {run.mode}: use --out DIR for a new profile")
    new = dict(metadata)
    new["batch_sizes"] = sorted({int(b) for b in rows["batch_size"]} | {int(b) for b in run.batch_sizes})
    known = {d["name"] for d in run.devices}
    measured_elsewhere = rows[~rows["device"].isin(known)].drop_duplicates("device")
    new["devices"] = list(run.devices) + [
        {"name": r.device, "kind": r.device_kind, "description": "(named by the measured rows only)",
         "memory_bytes": None, "backend": run.backend} for r in measured_elsewhere.itertuples()]
    transfers = read_table(directory / "transfers.csv", "transfers", TRANSFER_COLUMNS)
    if len(transfers):  # refit the copy costs rather than measure them again beside the old samples
        new["transfers"] = {pair_key(src, dst): fit_line(list(g["bytes"]), list(g["seconds"])).as_dict()
                            for (src, dst), g in transfers.groupby(["src", "dst"], sort=False)}
        new["host_device"] = str(transfers["src"].iloc[0])  # the copies start from the host
    note = (f"metadata.json was rebuilt from {len(summary)} layer rows and {len(model)} model rows and this "
            f"run's options: the rows' model file, inputs and timing settings could not be checked and are "
            f"taken to be this run's")
    new["rebuilt"] = note
    return new, note
