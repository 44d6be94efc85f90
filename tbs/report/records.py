"""The report's record of the profile itself: every cell with its status and reason, what was not
measured and why (missing device kinds, failed cells, an unfinished profile), and the environment and
prices it was measured under."""

from __future__ import annotations

import json

import pandas as pd

from tbs.report.vocabulary import INACTIVE_MARK
from tbs.report.page import ReportData, esc as _esc, table as _table
from tbs.schema import NOT_MEASURED, ProfileStatus
from tbs.units import PER_MILLION, format_seconds, format_usd, is_number


def section_cells(data: ReportData) -> str:
    s = data.summary.copy()
    if s.empty:
        return ""
    s["time / sample"] = s["per_sample_s"].map(format_seconds)
    s["IQR / sample"] = [f"{format_seconds(a / b)} – {format_seconds(c / b)}" if is_number(a) else "-"
                         for a, b, c in zip(s["p25_s"], s["batch_size"], s["p75_s"])]
    s["cost / 1M"] = [format_usd(c * PER_MILLION) if is_number(c) else "no price" for c in s["cost_per_sample_usd"]]
    cols = ["layer", "layer_type", "category", "device", "batch_size", "status", "n", "time / sample",
            "IQR / sample", "cost / 1M", "reason"]
    if data.training:  # the train step's parts; blank where a phase failed
        for phase in ("forward", "backward", "update"):
            s[f"{phase} / sample"] = [format_seconds(v / b) if is_number(v) else "" for v, b in
                                      zip(pd.to_numeric(s[f"{phase}_s"], errors="coerce"), s["batch_size"])]
        cols[7:7] = ["phases", "forward / sample", "backward / sample", "update / sample"]
    s["reason"] = [r if isinstance(r, str) else "" for r in s["reason"]]
    inactive = data.view.inactive
    s["reason"] = [f"{INACTIVE_MARK} inactive in {data.profile.mode}: passes its input through. {r}".strip()
                   if layer in inactive else r for layer, r in zip(s["layer"], s["reason"])]
    s["layer"] = s["layer"].map(data.view.label)
    return f'<h2 id="cells">Every cell</h2>{_table(s[cols], "status")}'


def section_not_measured(data: ReportData) -> str:
    meta = data.profile.meta
    missing = "".join(f"<li>{_esc(k)}: {_esc(v)}</li>" for k, v in meta.devices_missing.items())
    s = data.profile.summary
    failed = s[s["status"].isin(NOT_MEASURED)] if len(s) else s
    rows = "".join(f"<li>{_esc(r['layer'])} on {_esc(r['device'])} @ batch {r['batch_size']}: "
                   f"<b>{_esc(r['status'])}</b> {_esc(r['reason'])}</li>" for _, r in failed.iterrows())
    status = meta.status
    unfinished = (f"<p><b>This profile is {status}</b>: finish it with tbs profile … --resume.</p>"
                  if status not in (None, ProfileStatus.COMPLETE.value) else "")
    return (f'<h2 id="missing">Not measured</h2>{unfinished}<ul>{missing or "<li>No device kind missing.</li>"}</ul>'
            f'<ul>{rows or "<li>No failed cell.</li>"}</ul>')


def section_environment(data: ReportData) -> str:
    meta = data.profile.meta
    envs = meta.environments or [{k: meta.recorded(k) for k in ("host", "versions", "settings", "command",
                                                                "started", "backend")}]
    prices = {"USD per hour": meta.recorded("prices_usd_per_hour"), "spot discount": meta.recorded("spot_discount"),
              "sources": meta.recorded("price_sources")}
    blocks = "".join(f"<pre>{_esc(json.dumps(e, indent=2, default=str))}</pre>" for e in envs)
    return (f'<h2 id="environment">Environment</h2>{blocks}<h3>Prices</h3>'
            f'<pre>{_esc(json.dumps(prices, indent=2, default=str))}</pre>')
