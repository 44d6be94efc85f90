"""In-context attribution: each layer's share of a traced whole-model call (no framework here).

A backend traces a few compiled calls of the whole model with its own profiler (``Device.trace_calls``):
every op with the framework op paths it runs, which carry the Keras layer's name scope. Here each
op's time goes to its layers:

- an op whose paths all name one layer is that layer's;
- a fused kernel running several layers' ops is *shared*: its time is split in proportion to each
  layer's work inside it (FLOPs, or elements written for elementwise work) and every layer's row says
  with whom it shares (``in_model_shared_s``), never given whole to one;
- ops that overlap in time (two thunks on two threads) split the overlapped stretch equally, so
  no second is counted twice;
- the time inside a call no op covers (scheduling, waiting, the executor), and ops that name no
  layer (a parameter copy), are the framework's own (``unowned_s``).

So Σ in-model + unowned = the traced call's span (first op's start to last op's end), by construction.
Means over the traced calls are kept (means add up; medians would not), leaving out a call whose span is
over ``SLOW_CALL`` times the median call's: on a shared machine one call can be descheduled mid-op (a 0.4 ms
gather traced at 8.6 ms in one call of three), and a mean would give that to whichever op was running.
ops.csv keeps every call.

``ops.csv`` keeps every traced op as measured (``op_rows``); a profile's in-model columns are
derived from it when it is read (``summary_columns``, ``model_columns``), so the report and the
trace never measure again and a profile without it reads blank.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from tbs.backends.base import TracedCalls

CALLS = 3  # whole-model calls traced per (device, batch): after its timed samples, never among them
CALL, OP = "call", "op"  # ops.csv's ``kind``: a traced call's span, or one op in it
SLOW_CALL = 1.5  # a traced call this many times the median call's span was disturbed: left out of the mean
CHEAPER, DEARER = 0.8, 1.25  # in-model / isolated beyond these: "cheaper" or "dearer in context"


def layer_of(path: str, names: list[str]) -> str | None:
    """The Keras layer a framework op path belongs to: the longest layer name whose segments appear in it.

    A segment may carry the numeric suffix TensorFlow adds to a repeated name scope (``conv_1`` for ``conv``);
    an exact name wins over a suffixed one, and between names otherwise alike the innermost (the one whose
    scope comes later in the path: a layer inside a block) wins.
    """
    segments = [s for s in path.split("/") if s]
    bases = [_unsuffixed(s) for s in segments]
    by_first = _names_by_first_segment(tuple(names))
    best: tuple[int, int, int, str] | None = None
    for first in dict.fromkeys([*segments, *filter(None, bases)]):  # only a name starting there can match
        for name, wanted in by_first.get(first, ()):
            for exact in (True, False):
                at = _position(segments, bases, wanted, exact)
                if at is not None:
                    rank = (len(wanted), 1 if exact else 0, at, name)
                    best = rank if best is None or rank[:3] > best[:3] else best
                    break
    return best[3] if best else None


@lru_cache(maxsize=8)
def _names_by_first_segment(names: tuple[str, ...]) -> dict[str, list[tuple[str, list[str]]]]:
    """Layer names by their first scope segment, in the order given (a 200-layer model's kernels are matched
    against 200 names each: looked up, not scanned)."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for name in names:
        wanted = name.split("/")
        out.setdefault(wanted[0], []).append((name, wanted))
    return out


def _unsuffixed(segment: str) -> str | None:
    """``conv`` for TensorFlow's repeated scope ``conv_1``; None where the segment has no numeric suffix."""
    found = _SUFFIXED.fullmatch(segment)
    return found.group(1) if found else None


_SUFFIXED = re.compile(r"(.+)_\d+")


def _position(segments: list[str], bases: list[str | None], wanted: list[str], exact: bool) -> int | None:
    """Where ``wanted`` last appears among ``segments`` (None: nowhere); not ``exact``: a segment may be one of
    ``wanted``'s with a numeric suffix (its base in ``bases``)."""
    n = len(wanted)
    for i in range(len(segments) - n, -1, -1):
        if all(s == w or (not exact and b == w) for s, b, w in zip(segments[i:i + n], bases[i:i + n], wanted)):
            return i
    return None


def op_rows(traced: TracedCalls, base: dict[str, Any]) -> list[dict[str, Any]]:
    """ops.csv rows of one traced cell: one per call (its span), one per op (its paths and their work as JSON)."""
    identity = {k: base[k] for k in ("device", "batch_size", "mode")}
    rows = [dict(identity, kind=CALL, call=i, name="", start_s=start, duration_s=duration, parts="", tool=traced.tool)
            for i, (start, duration) in enumerate(traced.calls)]
    rows += [dict(identity, kind=OP, call=op.call, name=op.name, start_s=op.start_s, duration_s=op.duration_s,
                  parts=json.dumps(op.parts, separators=(",", ":")), tool=traced.tool) for op in traced.ops]
    return rows


@dataclass
class Attribution:
    """One (device, batch)'s traced calls attributed to layers: mean seconds per call."""

    whole_s: float  # the traced call's span
    calls: int
    layer_s: dict[str, float] = field(default_factory=dict)  # each layer's in-model seconds
    shared_s: dict[str, float] = field(default_factory=dict)  # the part of it from kernels shared with other layers
    shared_with: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    overlapped_with: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    unowned_s: float = 0.0  # the framework's own time: no op, or an op naming no layer
    tool: str = ""


def parts_of(text: Any) -> list[list[Any]]:
    """An ops.csv row's ``parts`` (JSON: [op path, its work] pairs); none where blank."""
    return json.loads(text) if isinstance(text, str) and text else []


def op_weights(parts: list[list[Any]], names: list[str], cache: dict[str, str | None]) -> dict[str, float]:
    """Each layer's fraction of one op (its work inside the op); empty where no path names a layer."""
    work: dict[str, float] = defaultdict(float)
    for path, amount in parts:
        if path not in cache:
            cache[path] = layer_of(str(path), names)
        if cache[path] is not None:
            work[cache[path]] += max(float(amount), 0.0)
    total = sum(work.values())
    if not work:
        return {}
    return {layer: (w / total if total > 0 else 1.0 / len(work)) for layer, w in work.items()}


def attribute(rows: Iterable[dict[str, Any]], names: list[str]) -> Attribution | None:
    """The ops.csv rows of one (device, batch, mode), attributed to ``names`` (the profile's layers)."""
    rows = list(rows)
    calls = {int(r["call"]): (float(r["start_s"]), float(r["duration_s"])) for r in rows if r["kind"] == CALL}
    if not calls:
        return None
    typical = float(np.median([d for _, d in calls.values()]))
    calls = {c: span for c, span in calls.items() if span[1] <= SLOW_CALL * typical}
    result = Attribution(whole_s=sum(d for _, d in calls.values()) / len(calls), calls=len(calls),
                         tool=str(rows[0].get("tool") or ""))
    cache: dict[str, str | None] = {}
    ops = [(float(r["start_s"]), float(r["start_s"]) + float(r["duration_s"]), str(r["name"]),
            op_weights(parts_of(r["parts"]), names, cache))
           for r in rows if r["kind"] == OP and int(r["call"]) in calls]
    for weights in (w for _, _, _, w in ops):
        if len(weights) > 1:
            for layer in weights:
                result.shared_with[layer] |= set(weights) - {layer}
    owned = _sweep(ops, result)
    span = sum(d for _, d in calls.values())
    result.unowned_s = max(span - owned, 0.0) / len(calls)
    for layer in list(result.layer_s):
        result.layer_s[layer] /= len(calls)
        result.shared_s[layer] = result.shared_s.get(layer, 0.0) / len(calls)
    return result


def _sweep(ops: list[tuple[float, float, str, dict[str, float]]], result: Attribution) -> float:
    """Split time between the ops running at each instant (equally), then each op's part among its layers.

    Returns the seconds owned by some layer (summed over calls).
    """
    events = sorted([(start, 1, i) for i, (start, _, _, _) in enumerate(ops)]
                    + [(end, 0, i) for i, (_, end, _, _) in enumerate(ops)])
    active: set[int] = set()
    owned, last = 0.0, None
    for time, starts, index in events:
        if active and last is not None and time > last:
            piece = (time - last) / len(active)
            for i in active:
                weights = ops[i][3]
                others = {layer for j in active if j != i for layer in ops[j][3]}  # other ops running meanwhile
                for layer, fraction in weights.items():
                    result.layer_s[layer] = result.layer_s.get(layer, 0.0) + piece * fraction
                    owned += piece * fraction
                    if len(weights) > 1:
                        result.shared_s[layer] = result.shared_s.get(layer, 0.0) + piece * fraction
                    result.overlapped_with[layer] |= others - {layer}
        last = time
        (active.add if starts else active.discard)(index)
    return owned


def explain(layer: str, in_model_s: float | None, isolated_s: float | None, found: Attribution) -> str:
    """Why a layer's in-model time differs from its isolated one, in a few words."""
    partners = sorted(found.shared_with.get(layer, ()))
    if not in_model_s:
        return (f"fused into {', '.join(partners[:4])}" if partners
                else "no kernel of its own in the compiled model (removed, or a view of its input)")
    reasons = []
    if partners:
        whole = found.shared_s.get(layer, 0.0) >= 0.99 * in_model_s
        reasons.append(f"{'fused' if whole else 'shares a kernel'} with {', '.join(partners[:4])}"
                       f"{' …' if len(partners) > 4 else ''} (kernel time split by work)")
    overlapped = sorted(found.overlapped_with.get(layer, ()))
    if overlapped:
        reasons.append(f"overlapped with {', '.join(overlapped[:3])}{' …' if len(overlapped) > 3 else ''}")
    if isolated_s:
        ratio = in_model_s / isolated_s
        if ratio < CHEAPER:
            reasons.append(f"cheaper in context ({ratio:.2f}× isolated)")
        elif ratio > DEARER:
            reasons.append(f"dearer in context ({ratio:.2f}× isolated)")
        elif not reasons:
            reasons.append("as isolated")
    return "; ".join(reasons)


SUMMARY_IN_MODEL = ["in_model_s", "model_share", "in_model_shared_s", "in_model_note"]
MODEL_IN_MODEL = ["in_model_s", "model_share", "unowned_s", "traced_calls"]


def attributions(ops: Any, names: list[str]) -> dict[tuple, Attribution]:
    """ops.csv (a DataFrame) attributed per (device, batch_size, mode)."""
    if ops is None or ops.empty:
        return {}
    out = {}
    for key, group in ops.groupby(["device", "batch_size", "mode"], sort=False):
        found = attribute(group.to_dict("records"), names)
        if found is not None:
            out[(str(key[0]), int(key[1]), str(key[2]))] = found
    return out


def with_in_model(summary: Any, model: Any, ops: Any, names: list[str]) -> tuple[Any, Any]:
    """summary and model frames with their in-model columns filled from ops.csv (blank where nothing was traced)."""
    found = attributions(ops, names)
    summary, model = summary.copy(), model.copy()
    for column in SUMMARY_IN_MODEL:
        summary[column] = None
    for column in MODEL_IN_MODEL:
        model[column] = None
    if not found:
        return summary, model
    for index, row in summary.iterrows():
        cell = found.get((str(row["device"]), int(row["batch_size"]), str(row["mode"])))
        if cell is None:
            continue
        seconds = cell.layer_s.get(str(row["layer"]), 0.0)
        isolated = row.get("median_s")
        isolated = float(isolated) if isolated is not None and isolated == isolated else None
        summary.at[index, "in_model_s"] = seconds
        summary.at[index, "model_share"] = seconds / cell.whole_s if cell.whole_s > 0 else None
        summary.at[index, "in_model_shared_s"] = cell.shared_s.get(str(row["layer"]), 0.0)
        summary.at[index, "in_model_note"] = explain(str(row["layer"]), seconds, isolated, cell)
    for index, row in model.iterrows():
        cell = found.get((str(row["device"]), int(row["batch_size"]), str(row["mode"])))
        if cell is not None:
            model.at[index, "in_model_s"] = cell.whole_s
            model.at[index, "model_share"] = 1.0
            model.at[index, "unowned_s"] = cell.unowned_s
            model.at[index, "traced_calls"] = cell.calls
    return summary, model
