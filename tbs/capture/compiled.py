"""The capture of a batch too large for one eager pass: records traced, arguments a part at a time.

An eager pass of a Functional model keeps every activation until it returns (Keras fills a
dict of every tensor the graph makes): ResNet50 holds 141 MiB a sample, 35 GiB at batch 256,
while its compiled program needs a tenth of that. Here the same recorder runs inside a
compiled program instead. ``records`` traces it on shapes alone (no data, nothing run): every
call's record (shapes, bytes) and the layer graph. ``part`` runs it for real and returns only
the named calls' arguments: the program computes what they need and frees the rest as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from tbs.backends.base import Device
from tbs.capture.recorder import Capture, LayerCall, capture


@dataclass
class Traced:
    """Every call's record at one batch (its arguments are the trace's stand-ins, for the structure
    and the compiler's analysis only) and the graph."""

    capture: Capture
    specs: dict[str, list[Any]]  # call name -> a shape-and-dtype stand-in for each flat tensor argument


def records(model: Any, inputs: Any, device: Device, tensors_fn: Callable[[Any], list[Any]],
            rebuild_fn: Callable[[Any, list[Any]], Any]) -> Traced | None:
    """Trace one forward pass on the shapes of ``inputs`` (None where the backend cannot trace)."""
    box: dict[str, Capture] = {}

    def forward(*flat: Any) -> Any:
        box["capture"] = capture(model, rebuild_fn(inputs, list(flat)), False)
        return box["capture"].outputs

    if not device.trace(forward, [device.abstract(x) for x in tensors_fn(inputs)], model.variables):
        return None
    cap = box["capture"]
    specs = {c.name: [device.abstract(x) for x in tensors_fn((c.args, c.kwargs))] for c in cap.calls}
    return Traced(Capture(cap.calls, cap.edges, None), specs)


def part(model: Any, inputs: Any, device: Device, traced: Traced, names: set[str],
         tensors_fn: Callable[[Any], list[Any]], rebuild_fn: Callable[[Any, list[Any]], Any]) -> Capture:
    """The calls in ``names`` with their real arguments, from one compiled pass that returns only those.

    Their outputs are not kept (a cell's program makes its own): a part holds its calls' inputs.
    """
    order: list[str] = []

    def forward(*flat: Any) -> list[Any]:
        cap = capture(model, rebuild_fn(inputs, list(flat)), False)
        order[:] = [c.name for c in cap.calls]
        return [x for c in cap.calls if c.name in names for x in tensors_fn((c.args, c.kwargs))]

    out = device.compiled_outputs(forward, tensors_fn(inputs), model.variables)
    if out is None:
        raise RuntimeError(f"{device.name} cannot run a compiled capture")
    if order != [c.name for c in traced.capture.calls]:
        raise RuntimeError("the compiled pass called the layers in another order than its trace")
    calls: list[LayerCall] = []
    at = 0
    for call in traced.capture.calls:
        if call.name in names:
            count = len(traced.specs[call.name])
            args, kwargs = rebuild_fn((call.args, call.kwargs), out[at:at + count])
            calls.append(replace(call, args=args, kwargs=kwargs, outputs=None, op_devices={}))
            at += count
    return Capture(calls, traced.capture.edges, None)
