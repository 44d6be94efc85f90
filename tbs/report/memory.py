"""The report's memory section: what the whole model needs per batch, and the largest batch that fits.

It reads the profile only: the compiled program's memory per batch (model.csv) and each
device's capacity search (metadata ``capacity``), whose every real call is listed with its
measured peak or its failure.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from tbs.report.vocabulary import capacity_line
from tbs.report.page import ReportData, esc, table
from tbs.units import format_bytes, is_number


def _per_batch(data: ReportData) -> pd.DataFrame:
    """Compiled memory per device and batch, with the measured peak where a capacity call ran at that batch."""
    model = data.model
    if model.empty or "memory_bytes" not in model:
        return pd.DataFrame()
    peaks: dict[tuple[str, int], float] = {}
    for device, found in data.profile.meta.capacity.items():
        for attempt in found.get("tries", []):
            if attempt.get("ok") and is_number(attempt.get("peak_bytes")):
                peaks[(device, int(attempt["batch_size"]))] = float(attempt["peak_bytes"])
    rows = []
    for _, r in model.iterrows():
        rows.append({"device": r["device"], "batch": int(r["batch_size"]),
                     "compiled: arguments": format_bytes(r.get("argument_bytes")),
                     "outputs": format_bytes(r.get("output_bytes")), "temporaries": format_bytes(r.get("temp_bytes")),
                     "total": format_bytes(r.get("memory_bytes")),
                     "measured peak": format_bytes(peaks.get((str(r["device"]), int(r["batch_size"])))
                                                   or r.get("peak_bytes"))})
    frame = pd.DataFrame(rows)
    # A host CPU keeps no per-program peak (--capacity measures one): no column of blanks then.
    return frame.drop(columns="measured peak") if (frame["measured peak"] == "").all() else frame


def _tries(device: str, found: Mapping[str, Any]) -> pd.DataFrame:
    return pd.DataFrame([{"device": device, "batch": t["batch_size"], "ran": "yes" if t.get("ok") else "no",
                          "measured peak": format_bytes(t.get("peak_bytes")) if t.get("ok") else "",
                          "failure": "" if t.get("ok") else t.get("reason", "")}
                         for t in found.get("tries", [])])


def section_memory(data: ReportData) -> str:
    parts = ['<h2 id="capacity">Memory and the largest batch</h2>',
             '<p class="note">Compiled memory is XLA\'s memory analysis of the whole model\'s program (weights and '
             'inputs, outputs, temporaries), fitted as a line in the batch size against each device\'s memory. '
             'With tbs profile --capacity the largest batch comes from real calls that double while the measured '
             'peak allows, then one at the limit that peak extrapolates to; each call is listed, failures included. '
             'Placement treats a device\'s memory as a hard limit.</p>']
    per_batch = _per_batch(data)
    if len(per_batch):
        parts.append(table(per_batch))
    capacity = data.profile.meta.capacity
    if not capacity:
        parts.append('<p class="note">No memory fit in this profile: no compiled memory figures (tbs profile '
                     '--no-analysis, or a profile from before tbs 0.4).</p>')
    for device, found in capacity.items():
        parts.append(f"<p>{esc(capacity_line(device, found))}</p>")
        tries = _tries(device, found)
        if len(tries):
            parts.append(table(tries))
    return "\n".join(parts)

