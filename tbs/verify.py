"""Run a recommended placement for real and time it against single devices.

The split model is the recorded forward pass replayed: every leaf call, in
order, runs inside its chosen device's scope, on that device's own copy of the
model (weights live where they run), and each tensor flows from the call that
produced it — so only the activations that cross devices move. On TensorFlow the
replay is one graph with a device scope per call; on JAX each call is compiled
for its device and the replay copies inputs between them (one jit cannot span
devices).
Single-device placements are replayed the same way from the same host inputs,
and all runners are sampled in interleaved rounds with the profiler's statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tbs.capture import Capture, LayerCall
from tbs.devices import Device
from tbs.stats import Summary
from tbs.tensors import iter_tensors, replace_tensors
from tbs.timing import Interleaved, Measurement, Timer, TimingConfig

Source = tuple[str, int]  # (call name or "input", flat index)


def dataflow(capture: Capture, model_inputs: Any) -> tuple[list[list[Source | None]], list[Source]]:
    """For each call, where each of its tensor arguments comes from; and where the outputs come from."""
    origin: dict[int, Source] = {id(x): ("input", i) for i, x in enumerate(iter_tensors(model_inputs))}
    plan = []
    for call in capture.calls:
        plan.append([origin.get(id(x)) for x in iter_tensors((call.args, call.kwargs))])
        for i, out in enumerate(iter_tensors(call.outputs)):
            origin[id(out)] = (call.name, i)
    outputs = [origin[id(x)] for x in iter_tensors(capture.outputs)]
    return plan, outputs


def replay_fn(placement: dict[str, str], calls_on: dict[str, dict[str, LayerCall]], devices: dict[str, Device],
              plan: list[list[Source | None]], outputs: list[Source], order: list[str]) -> Callable[..., Any]:
    """A function of the model's flat inputs that runs every call on its placed device."""

    def replay(*model_inputs: Any) -> Any:
        values: dict[Source, Any] = {("input", i): x for i, x in enumerate(model_inputs)}
        for name, sources in zip(order, plan):
            device = placement[name]
            call = calls_on[device][name]
            fed = [x if source is None else values[source]
                   for x, source in zip(iter_tensors((call.args, call.kwargs)), sources)]
            args, kwargs = replace_tensors((call.args, call.kwargs), fed)
            out = devices[device].run_placed(call, args, kwargs)
            for i, tensor in enumerate(iter_tensors(out)):
                values[(name, i)] = tensor
        return [values[source] for source in outputs]

    return replay


@dataclass
class Verified:
    name: str
    placement: dict[str, str]
    predicted_seconds_per_batch: float
    measured: Summary
    status: str

    def overlaps(self, other: "Verified") -> bool:
        return not (self.measured.ci_high_s < other.measured.ci_low_s or other.measured.ci_high_s < self.measured.ci_low_s)


def run(candidates: list[tuple[str, dict[str, str], float]], captures: dict[str, Capture], model_inputs: Any,
        devices: dict[str, Device], host: Device, config: TimingConfig) -> list[Verified]:
    """Time each (name, placement, predicted seconds) candidate from host inputs, interleaved."""
    reference = captures[host.name] if host.name in captures else next(iter(captures.values()))
    plan, outputs = dataflow(reference, model_inputs)
    order = [c.name for c in reference.calls]
    calls_on = {d: {c.name: c for c in cap.calls} for d, cap in captures.items()}
    flat = list(iter_tensors(model_inputs))
    timer = Timer(config)
    sampler = Interleaved(timer, host.compile_blocked(lambda x: x, [host.place(np.ones((), np.float32))], False))
    for name, placement, _ in candidates:
        sampler.add(name, host.replay_runner(replay_fn(placement, calls_on, devices, plan, outputs, order), flat))
    done: dict[Any, Measurement] = {}
    sampler.run(on_done=done.__setitem__)
    return [Verified(name, placement, predicted, done[name].summary(), done[name].status)
            for name, placement, predicted in candidates]


def verdict(split: Verified, best_single: Verified) -> str:
    """A split is a win only when it measures better with non-overlapping confidence intervals."""
    if split.placement == best_single.placement:
        return "the recommendation is a single device"
    if split.measured.median_s < best_single.measured.median_s and not split.overlaps(best_single):
        return "measured win: the split is faster than the best single device"
    if split.overlaps(best_single):
        return "no measured win: the split and the best single device are within each other's noise"
    return "no measured win: the best single device is faster; keep it"


def relative_error(predicted: float, measured: float) -> float:
    return math.inf if measured <= 0 else (predicted - measured) / measured
