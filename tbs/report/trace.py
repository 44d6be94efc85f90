"""A timeline a user can open: the profile as a Chrome/Perfetto trace (JSON trace-event format).

One process per device. Per batch size, threads ``in context`` hold the traced whole-model calls
from ops.csv: each call a span, each run of consecutive ops of one layer a span inside it (a kernel
shared by several layers is named after all of them), each op an event inside that; ops that ran
at the same time as an earlier one go to a second lane (``in context, lane 2``), since one thread's
events must nest. The thread ``isolated`` lays every measured cell of that batch end to end in model
order, each as long as its median call (its raw per-call samples in its args), then the whole model:
what the layers cost one after another when each runs alone. Open it in https://ui.perfetto.dev or
chrome://tracing. Nothing is measured here: it is drawn from the profile's files.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from tbs.measure.in_context import CALL, OP, op_weights, parts_of
from tbs.profiles.profile import Profile
from tbs.units import is_number

US = 1e6  # the format's timestamps are microseconds


def _meta(pid: int, tid: int | None, kind: str, name: str, order: int | None = None) -> list[dict[str, Any]]:
    base = {"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {})}
    out = [dict(base, name=kind, args={"name": name})]
    if order is not None:
        out.append(dict(base, name=kind.replace("_name", "_sort_index"), args={"sort_index": order}))
    return out


def _span(pid: int, tid: int, name: str, start_s: float, seconds: float, category: str,
          args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": category, "ts": round(start_s * US, 3),
            "dur": round(max(seconds, 0.0) * US, 3), "args": args or {}}


def _owners(parts: Any, names: list[str], cache: dict[str, str | None]) -> dict[str, float]:
    """The layers an op runs and each one's fraction of its work (ops.csv keeps its parts as JSON)."""
    return op_weights(parts_of(parts), names, cache)


def _lanes(ops: pd.DataFrame) -> list[list[dict[str, Any]]]:
    """Ops in lanes where none overlaps another (greedy: the first lane free at its start)."""
    lanes: list[list[dict[str, Any]]] = []
    ends: list[float] = []
    for op in ops.sort_values("start_s").to_dict("records"):
        start, end = float(op["start_s"]), float(op["start_s"]) + float(op["duration_s"])
        free = next((i for i, e in enumerate(ends) if e <= start + 1e-12), None)
        if free is None:
            lanes.append([])
            ends.append(0.0)
            free = len(lanes) - 1
        lanes[free].append(op)
        ends[free] = end
    return lanes


def _in_context(pid: int, tid: int, batch: int, cell: pd.DataFrame, names: list[str]) -> list[dict[str, Any]]:
    """The traced calls of one (device, batch): call spans, layer runs and ops, one thread per lane."""
    events: list[dict[str, Any]] = []
    cache: dict[str, str | None] = {}
    calls = cell[cell["kind"] == CALL]
    ops = cell[cell["kind"] == OP]
    lanes = _lanes(ops)
    for lane, lane_ops in enumerate(lanes or [[]]):
        label = f"batch {batch}: in context" + (f", lane {lane + 1}" if lane else "")
        events += _meta(pid, tid + lane, "thread_name", label, tid + lane)
        if lane == 0:
            for call in calls.to_dict("records"):
                events.append(_span(pid, tid, f"whole model call {int(call['call']) + 1}", float(call["start_s"]),
                                    float(call["duration_s"]), "call", {"tool": call.get("tool")}))
        run: list[dict[str, Any]] = []
        for op in lane_ops + [None]:
            owners = _owners(op["parts"], names, cache) if op is not None else None
            key = " + ".join(sorted(owners)) if owners else "(the framework)"
            if run and (op is None or key != run[0]["_key"] or int(op["call"]) != int(run[0]["call"])):
                first, last = float(run[0]["start_s"]), max(float(r["start_s"]) + float(r["duration_s"]) for r in run)
                events.append(_span(pid, tid + lane, run[0]["_key"], first, last - first, "layer",
                                    {"shared": " + " in run[0]["_key"]}))
                events += [_span(pid, tid + lane, str(r["name"]), float(r["start_s"]), float(r["duration_s"]), "op",
                                 {"layers": r["_owners"]}) for r in run]
                run = []
            if op is not None:
                run.append(dict(op, _key=key, _owners=owners or {}))
    return events


def _isolated(pid: int, tid: int, batch: int, profile: Profile, device: str, names: list[str]) -> list[dict[str, Any]]:
    """Each measured cell of (device, batch) end to end, in model order, as long as its median call."""
    summary, model, samples = profile.summary, profile.model, profile.samples
    rows = summary[(summary["device"] == device) & (summary["batch_size"] == batch)]
    events = _meta(pid, tid, "thread_name", f"batch {batch}: isolated (each cell alone, end to end)", tid)
    at = 0.0
    order = {name: i for i, name in enumerate(names)}
    cells = [(r["layer"], "layer", r) for r in rows.to_dict("records")]
    cells.sort(key=lambda c: order.get(c[0], len(order)))
    whole = model[(model["device"] == device) & (model["batch_size"] == batch)]
    cells += [("whole model", "model", r) for r in whole.to_dict("records")]
    for name, target, row in cells:
        median = row.get("median_s")
        if not is_number(median):
            continue
        mine = samples[(samples["device"] == device) & (samples["batch_size"] == batch) & (samples["target"] == target)
                       & (samples["layer"] == (row["layer"] if target == "layer" else samples["layer"]))]
        per_call = [float(v) for v in mine["seconds_per_call"] if is_number(v)] if len(mine) else []
        events.append(_span(pid, tid, str(name), at, float(median), f"isolated {target}",
                            {"median_s": float(median), "status": row.get("status"), "seconds_per_call": per_call}))
        at += float(median)
    return events


def render(profile: Profile) -> str:
    """The profile's trace-event JSON (a str; the CLI writes it)."""
    names = profile.layer_names
    devices = sorted(set(profile.summary["device"].dropna()) | set(profile.model["device"].dropna()))
    events: list[dict[str, Any]] = []
    ops = profile.ops
    for pid, device in enumerate(devices, start=1):
        events += _meta(pid, None, "process_name", f"{device} ({profile.meta.backend or 'tensorflow'})", pid)
        batches = sorted({int(b) for b in profile.summary.loc[profile.summary["device"] == device, "batch_size"]})
        tid = 1
        for batch in batches:
            cell = ops[(ops["device"] == device) & (ops["batch_size"].astype(float) == batch)] if len(ops) else ops
            if len(cell):
                traced = _in_context(pid, tid, batch, cell, names)
                events += traced
                tid += len({e["tid"] for e in traced if "tid" in e})
            events += _isolated(pid, tid, batch, profile, device, names)
            tid += 1
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"model": str(profile.meta.model.get("name", "")), "tool": "tbs"}}, indent=None)
