"""Inference cells: each layer's forward pass, and the whole model's, as one compiled program each.

The counterpart of ``training.TrainingCells``: the profiler asks either for the cells of
one (device, batch) and samples their programs the same way.
"""

from __future__ import annotations

from typing import Any, Callable

from tbs.backends.base import Device, ProgramCost
from tbs.capture.recorder import Capture, LayerCall
from tbs.measure import in_context, rows
from tbs.measure.dedupe import call_signature
from tbs.measure.timing import Measurement, Runner
from tbs.schema import Phase

FORWARD, OVERLAPPED = Phase.FORWARD.value, Phase.OVERLAPPED.value


def invoker(call: LayerCall, rebuild_fn: Callable[[Any, list[Any]], Any]) -> Callable[..., Any]:
    """The call as a function of its flat tensors (what a compiled program takes)."""
    structure = (call.args, call.kwargs)

    def invoke(*flat: Any) -> Any:
        args, kwargs = rebuild_fn(structure, list(flat))
        return call.invoke(*args, **kwargs)

    return invoke


class InferenceCells:
    """The inference cells of one (device, batch): every layer's forward pass and the whole model's."""

    def __init__(self, device: Device, cap: Capture, inputs: Any, model: Any, xla: bool, confidence: float,
                 tensors_fn: Callable[[Any], list[Any]], rebuild_fn: Callable[[Any, list[Any]], Any]) -> None:
        self.device, self.cap, self.inputs, self.model = device, cap, inputs, model
        self.xla, self.confidence = xla, confidence
        self.tensors_fn, self.rebuild_fn = tensors_fn, rebuild_fn

    def layer(self, call: LayerCall, label: str, base: dict[str, Any]) -> rows.Cell:
        def arguments() -> tuple[Any, list[Any], bool, Any]:
            return (invoker(call, self.rebuild_fn), self.tensors_fn((call.args, call.kwargs)), self.xla,
                    getattr(call.op, "variables", ()))

        def programs() -> dict[str, Runner]:
            return {FORWARD: self.device.compile_blocked(*arguments())}

        def analyse() -> dict[str, ProgramCost]:
            return {FORWARD: self.device.program_cost(*arguments())}

        def build(parts: dict[str, Measurement]) -> dict[str, Any]:
            return rows.layer_row(call, self.device, base, parts[FORWARD], self.confidence)

        return rows.Cell(label, base, (call.args, call.kwargs, call.outputs), programs, build,
                         analyse=analyse, call=call, signature=call_signature(call, self.device.name, "inference"))

    def step(self, label: str, base: dict[str, Any], copy_seconds: float, input_bytes: int) -> rows.Cell:
        inputs, model = self.inputs, self.model

        def forward(*tensors: Any) -> Any:
            return model(self.rebuild_fn(inputs, list(tensors)), training=False)

        def programs() -> dict[str, Runner]:
            tensors = self.tensors_fn(inputs)
            runners = {FORWARD: self.device.compile_blocked(forward, tensors, self.xla, model.variables,
                                                            outputs_written=True)}
            overlapped = self.device.overlapped_blocked(forward, tensors, self.xla, model.variables)
            return runners if overlapped is None else {**runners, OVERLAPPED: overlapped}

        def analyse() -> dict[str, ProgramCost]:
            return {FORWARD: self.device.program_cost(forward, self.tensors_fn(inputs), self.xla, model.variables)}

        def build(parts: dict[str, Measurement]) -> dict[str, Any]:
            row = rows.model_row(base, parts[FORWARD], copy_seconds, input_bytes, self.confidence)
            if OVERLAPPED in parts:
                row["overlapped_s"] = parts[OVERLAPPED].summary(self.confidence).median_s
            return row

        def trace() -> list[dict[str, Any]] | None:
            traced = self.device.trace_calls(forward, self.tensors_fn(inputs), self.xla, model.variables,
                                             in_context.CALLS)
            return None if traced is None else in_context.op_rows(traced, base)

        return rows.Cell(label, base, (inputs, self.cap.outputs), programs, build, target="model",
                         single_calls=rows.SINGLE_CALLS, analyse=analyse, several_calls_only=(OVERLAPPED,),
                         trace=trace)
