"""What each inference cell holds while it is sampled, and the parts a group too large for one capture is sampled in.

An eager capture holds every activation of the batch at once (``headroom.host_shortfall``). A
cell holds far less: a layer its inputs while its part is sampled, and while one of its calls
runs its outputs and the program's temporaries; the whole model what its compiled program
keeps live beyond its arguments, which are in memory already (XLA's buffer assignment: its
outputs and temporaries; the weights and the placed inputs are held anyway). The
compiler's figures come from this device's rows at the largest batch already measured, scaled
to this one (a line through zero: above any fixed part, so it errs high). Without them (no
analysis asked, or none yet) a layer is taken to need three times its tensors, as training's
chunks do, and the whole model is unsure: the profiler tries it by the largest-batch search's
real calls (each at most 2x a batch whose peak was measured) before it times it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from tbs.capture.recorder import LayerCall
from tbs.schema import MEASURED

PART_SHARE = 0.5  # a part's cells, together, hold at most this share of the headroom
ALONE_SHARE = 0.8  # a cell that alone needs more than this share is not run (the OS would kill the run)
UNKNOWN_FACTOR = 3.0  # a layer without the compiler's temporaries: this many times its inputs and outputs


@dataclass
class Need:
    """Bytes a cell holds: ``held`` while its part is sampled, ``running`` more while one of its calls runs."""

    held: float
    running: float
    source: str  # "compiler" (scaled from the compiler's memory analysis) or "tensors" (its shapes alone)

    @property
    def total(self) -> float:
        return self.held + self.running


@dataclass
class Plan:
    """The parts to sample one after another (layer names), and the cells that fit in none, with their need."""

    parts: list[list[str]] = field(default_factory=list)
    too_big: dict[str, Need] = field(default_factory=dict)


def compiler_figures(rows: Iterable[tuple[Any, dict[str, Any]]], device: str,
                     batch: int) -> tuple[dict[str, float], float | None]:
    """Per sample, from this device's measured rows at the largest batch below ``batch``: each layer's
    compiled temporaries, and the whole model's compiled outputs and temporaries (None where not known;
    its arguments, the weights and inputs, are in memory already)."""
    mine = [(k, r) for k, r in rows if k.device == device and int(k.batch_size) < batch and r.get("status") in MEASURED]
    temps: dict[str, float] = {}
    model: float | None = None
    for key, row in sorted(mine, key=lambda kr: int(kr[0].batch_size)):  # larger batches overwrite smaller
        size = int(key.batch_size)
        made = [_number(row.get(c)) for c in ("output_bytes", "temp_bytes")]
        if key.target == "model" and None not in made:
            model = sum(made) / size
        elif key.target == "layer" and _number(row.get("temp_bytes")) is not None:
            temps[key.layer] = _number(row.get("temp_bytes")) / size
    return temps, model


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def layer_need(call: LayerCall, batch: int, temp_per_sample: float | None) -> Need:
    """A layer cell at ``batch`` (``call``: its record at that batch)."""
    if temp_per_sample is None:
        return Need(call.input_bytes, (UNKNOWN_FACTOR - 1) * call.input_bytes + UNKNOWN_FACTOR * call.output_bytes,
                    "tensors")
    return Need(call.input_bytes, call.output_bytes + temp_per_sample * batch, "compiler")


def model_need(batch: int, made_per_sample: float | None) -> Need | None:
    """The whole model at ``batch``: what its compiled program makes, outputs and temporaries (None: not known)."""
    if made_per_sample is None:
        return None
    return Need(0.0, made_per_sample * batch, "compiler")


def plan(needs: dict[str, Need], free_bytes: float) -> Plan:
    """Cells in call order, a new part wherever the held inputs plus the largest running need would pass
    ``PART_SHARE`` of ``free_bytes``; a cell that alone needs more than ``ALONE_SHARE`` is set apart."""
    out = Plan()
    current: list[str] = []
    held = running = 0.0
    for name, need in needs.items():
        if need.total > ALONE_SHARE * free_bytes:
            out.too_big[name] = need
            continue
        if current and held + need.held + max(running, need.running) > PART_SHARE * free_bytes:
            out.parts.append(current)
            current, held, running = [], 0.0, 0.0
        current.append(name)
        held, running = held + need.held, max(running, need.running)
    if current:
        out.parts.append(current)
    return out


def shortfall_reason(what: str, batch: int, need: Need, free_bytes: float) -> str:
    """The row's reason for a cell that was not run: its need and what there was."""
    how = "from the compiler's memory analysis" if need.source == "compiler" else "from its tensors' sizes"
    return (f"out of memory: {what} at batch {batch} holds about {need.total / 2**30:.1f} GiB ({how}), "
            f"{free_bytes / 2**30:.1f} GiB is available")
