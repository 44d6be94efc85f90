"""Why a cell costs what it does: the compiler's FLOPs, bytes and memory for each program tbs times.

Each cell's programs are analysed once, when they are compiled (``Device.program_cost``:
XLA's HLO cost and memory analysis of the exact call). Where the compiler says nothing,
textbook shape formulas stand in and the row says ``formula``. A cell's row gets the
totals over its phases; ``analysis.csv`` keeps each phase's own figures.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tbs.backends.base import ProgramCost
from tbs.capture.recorder import LayerCall
from tbs.measure import rows
from tbs.columns import ANALYSIS_COLUMNS
from tbs.schema import CellKey, Phase

FORWARD, BACKWARD, UPDATE = Phase.FORWARD.value, Phase.BACKWARD.value, Phase.UPDATE.value
FORWARD_BACKWARD = Phase.FORWARD_BACKWARD.value

FORMULA = "formula"
# Layer categories whose every weight is used once per output position (a multiply-add each).
_WEIGHT_PER_POSITION = ("dense", "conv")


def _elements(shapes: list[list[int | None]]) -> int:
    return int(sum(math.prod(d or 1 for d in shape) for shape in shapes))


def formula_cost(call: LayerCall, why: str) -> ProgramCost:
    """Textbook FLOPs and bytes from the call's shapes and parameter count (Paleo-style).

    Dense/Conv: 2 x weights x output positions (a position: one output vector across the
    units/filters); RNN: 2 x weights per step x steps x batch; attention: its projections plus
    the QK^T and AV products. Everything else: one operation per output element. Bytes: the
    inputs, outputs and weights read or written once.
    """
    out_elements = _elements(call.output_shapes)
    last = (call.output_shapes[0][-1] or 1) if call.output_shapes and call.output_shapes[0] else 1
    params = int(call.params or 0)
    if call.category in _WEIGHT_PER_POSITION and params:
        flops = 2.0 * (params - last) * out_elements / last
    elif call.category == "rnn" and params and call.input_shapes and len(call.input_shapes[0]) >= 3:
        batch, steps = (call.input_shapes[0][0] or 1), (call.input_shapes[0][1] or 1)
        flops = 2.0 * params * steps * batch
    elif call.category == "attention" and call.input_shapes and len(call.input_shapes[0]) >= 3:
        batch, length, width = (call.input_shapes[0][0] or 1), (call.input_shapes[0][1] or 1), (call.input_shapes[0][-1] or 1)
        flops = 2.0 * params * batch * length + 4.0 * batch * length * length * width
    else:
        flops = float(out_elements)
    itemsize = 4  # the shapes do not carry dtypes: float32, the Keras default
    moved = call.input_bytes + call.output_bytes + params * itemsize
    return ProgramCost(source=FORMULA, flops=flops, bytes_accessed=float(moved), reason=why)


def analysed(analyse: Callable[[], dict[str, ProgramCost]], call: LayerCall | None, phase: str,
             cache: dict[tuple, dict[str, ProgramCost]] | None = None, key: tuple | None = None,
             phases: int = 1) -> dict[str, ProgramCost]:
    """The compiler's analysis of a cell's programs; for a layer it cannot analyse, the formula.

    With ``cache`` and a ``key`` (``signature``), a call already analysed is not analysed again.
    A cell of several phases (training) that cannot be analysed gets blanks, not a forward-only
    formula that its three-phase time would be divided by.
    """
    if cache is not None and key is not None and key in cache:
        return cache[key]
    found = _analysed(analyse, None if phases > 1 else call, phase)
    if cache is not None and key is not None:
        cache[key] = found
    return found


def _analysed(analyse: Callable[[], dict[str, ProgramCost]], call: LayerCall | None,
              phase: str) -> dict[str, ProgramCost]:
    try:
        return analyse()
    except Exception as exc:  # the analysis never stops a measurement
        why = f"no compiler analysis ({rows.reason(exc)})"
        if call is None:
            return {phase: ProgramCost(source="", reason=why)}
        return {phase: formula_cost(call, why)}


def _total(values: list[Any]) -> float | None:
    present = [float(v) for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    return float(sum(present)) if present and len(present) == len(values) else None


def row_columns(costs: dict[str, ProgramCost], whole_model: bool = False) -> dict[str, Any]:
    """A cell row's analysis columns: totals over its phases (blank if any phase lacks the figure).

    A whole model's row also gets the compiled program's memory: its arguments (weights and
    inputs), outputs and temporaries, and their sum, ``memory_bytes`` (what must fit at once).
    """
    parts = list(costs.values())
    names = ("flops", "bytes_accessed", "flops_unoptimized", "bytes_unoptimized", "transcendentals", "temp_bytes")
    if whole_model:
        names += ("argument_bytes", "output_bytes")
    row: dict[str, Any] = {name: _total([getattr(p, name) for p in parts]) for name in names}
    row["cost_source"] = "; ".join(dict.fromkeys(p.source for p in parts if p.source))
    if whole_model:
        row["memory_bytes"] = _total([row["argument_bytes"], row["output_bytes"], row["temp_bytes"]])
    return row


def analysis_rows(key: CellKey, costs: dict[str, ProgramCost]) -> list[dict[str, Any]]:
    """analysis.csv rows: one per phase of the cell."""
    out = []
    for phase, cost in costs.items():
        row = {"target": key.target, "layer": key.layer, "device": key.device, "batch_size": key.batch_size,
               "mode": key.mode, "phase": phase}
        row.update({c: getattr(cost, c, None) for c in ANALYSIS_COLUMNS if c not in row})
        row["cost_source"] = cost.source
        out.append(row)
    return out


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(float(a) - float(b), 0.0)


def phase_costs(found: dict[str, ProgramCost]) -> dict[str, ProgramCost]:
    """Per-phase costs as a training row counts them: a forward+backward program (TensorFlow's
    tape) less its forward is the backward, as with its time."""
    out = dict(found)
    both, forward = out.pop(FORWARD_BACKWARD, None), out.get(FORWARD)
    if both is None:
        return out
    if forward is None:
        out[FORWARD_BACKWARD] = both
        return out
    fields = ("flops", "bytes_accessed", "flops_unoptimized", "bytes_unoptimized", "transcendentals")
    out[BACKWARD] = ProgramCost(source=both.source, reason="forward+backward program less the forward",
                                temp_bytes=both.temp_bytes, argument_bytes=both.argument_bytes,
                                output_bytes=both.output_bytes,
                                **{f: _minus(getattr(both, f), getattr(forward, f)) for f in fields})
    return {k: out[k] for k in (FORWARD, BACKWARD, UPDATE) if k in out}
