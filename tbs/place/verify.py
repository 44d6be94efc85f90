"""Run a recommended placement for real and time it against single devices.

The split model is the recorded forward pass replayed: every leaf call, in
order, runs inside its chosen device's scope, on that device's own copy of the
model (weights live where they run), and each tensor flows from the call that
produced it — so only the activations that cross devices move. On TensorFlow the
replay is one graph with a device scope per call; on JAX each run of consecutive
calls on one device is compiled as one program for it (``Device.run_segment``: one
jit cannot span devices, but a split is deployed as one program per run) and the
replay copies inputs between them.
Single-device placements are replayed the same way from the same host inputs,
and all runners are sampled in interleaved rounds with the profiler's statistics.
A training profile's placement is verified as a whole train step: each call's
forward, backward and update on its device, activations moving forward and
gradients moving back (``Device.split_train_runner``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from pathlib import Path

import pandas as pd

from tbs import backends
from tbs.backends.base import Device, PlacedStep
from tbs.backends.tensors import iter_tensors, replace_tensors
from tbs.capture.recorder import Capture, LayerCall, capture
from tbs.errors import TbsError, TbsWarning
from tbs.load.inputs import batch_arrays, check_input_arrays, input_specs, load_user_input, structure_inputs
from tbs.load.model import ModelSource, compile_objects, load_model, load_model_object
from tbs.load.train_setup import TrainingSetup
from tbs.measure.train_cells import gradient_plan
from tbs.measure import neighbours
from tbs.measure.stats import Summary
from tbs.measure.timing import Interleaved, Measurement, Timer, TimingConfig
from tbs.place.result import Recommendation
from tbs.profiles.profile import Profile
from tbs.endpoints import GRAPH_INPUT
from tbs.schema import ARRAYS_INPUT, LOSS_LAYER, SYNTHETIC_INPUT

from tbs.backends.base import Source  # (call name or GRAPH_INPUT, flat index)


def dataflow(capture: Capture, model_inputs: Any) -> tuple[list[list[Source | None]], list[Source]]:
    """For each call, where each of its tensor arguments comes from; and where the outputs come from."""
    origin: dict[int, Source] = {id(x): (GRAPH_INPUT, i) for i, x in enumerate(iter_tensors(model_inputs))}
    plan = []
    for call in capture.calls:
        plan.append([origin.get(id(x)) for x in iter_tensors((call.args, call.kwargs))])
        for i, out in enumerate(iter_tensors(call.outputs)):
            origin[id(out)] = (call.name, i)
    outputs = [origin[id(x)] for x in iter_tensors(capture.outputs)]
    return plan, outputs


@dataclass(frozen=True)
class Segment:
    """Consecutive calls placed on one device: what a split deploys as one program there (``Device.run_segment``)."""

    device: str
    names: tuple[str, ...]
    inputs: tuple[Source, ...]  # the values it reads that came from elsewhere (graph inputs, other segments)
    outputs: tuple[Source, ...]  # the values it makes that a later segment or the model's outputs read


def segments(placement: dict[str, str], plan: list[list[Source | None]], outputs: list[Source],
             order: list[str]) -> list[Segment]:
    """The calls in order, cut wherever the device changes."""
    runs: list[tuple[str, list[int]]] = []
    for index, name in enumerate(order):
        if runs and runs[-1][0] == placement[name]:
            runs[-1][1].append(index)
        else:
            runs.append((placement[name], [index]))
    read_after: list[list[Source]] = []  # for each run, what the runs after it and the model's outputs read
    later: dict[Source, None] = dict.fromkeys(outputs)  # an ordered set: the same order in every process
    for _, indices in reversed(runs):
        read_after.append(list(later))
        later.update(dict.fromkeys(s for i in indices for s in plan[i] if s is not None))
    read_after.reverse()
    found = []
    for (device, indices), wanted in zip(runs, read_after):
        names = tuple(order[i] for i in indices)
        inputs = tuple(dict.fromkeys(s for i in indices for s in plan[i] if s is not None and s[0] not in names))
        outs = tuple(s for s in wanted if s[0] in names)
        found.append(Segment(device, names, inputs, outs))
    return found


def replay_fn(placement: dict[str, str], calls_on: dict[str, dict[str, LayerCall]], devices: dict[str, Device],
              plan: list[list[Source | None]], outputs: list[Source], order: list[str]) -> Callable[..., Any]:
    """A function of the model's flat inputs that runs every call on its placed device, each run of calls on one
    device as one program where the backend compiles it so (JAX: a jit cannot span devices, but can span a run)."""
    sources_of = dict(zip(order, plan))

    def body(segment: Segment, calls: list[LayerCall]) -> Callable[..., list[Any]]:
        def run(*tensors: Any, invoke: Callable[[Any, tuple, dict], Any]) -> list[Any]:
            values: dict[Source, Any] = dict(zip(segment.inputs, tensors))
            for call in calls:
                fed = [x if source is None else values[source]
                       for x, source in zip(iter_tensors((call.args, call.kwargs)), sources_of[call.name])]
                args, kwargs = replace_tensors((call.args, call.kwargs), fed)
                for i, tensor in enumerate(iter_tensors(invoke(call, args, kwargs))):
                    values[(call.name, i)] = tensor
            return [values[source] for source in segment.outputs]

        return run

    parts = []  # built once: the replay itself is timed
    for segment in segments(placement, plan, outputs, order):
        calls = [calls_on[segment.device][name] for name in segment.names]
        parts.append((segment, calls, body(segment, calls)))

    def replay(*model_inputs: Any) -> Any:
        values: dict[Source, Any] = {(GRAPH_INPUT, i): x for i, x in enumerate(model_inputs)}
        for segment, calls, run in parts:
            made = devices[segment.device].run_segment(segment, calls, run, [values[s] for s in segment.inputs])
            values.update(zip(segment.outputs, made))
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
        devices: dict[str, Device], host: Device, config: TimingConfig,
        trainer: "SplitTraining | None" = None) -> list[Verified]:
    """Time each (name, placement, predicted seconds) candidate from host inputs, interleaved.

    With ``trainer`` each candidate is a whole train step (forward, loss, backward, update) split as placed.
    """
    reference = captures[host.name] if host.name in captures else next(iter(captures.values()))
    plan, outputs = dataflow(reference, model_inputs)
    order = [c.name for c in reference.calls]
    calls_on = {d: {c.name: c for c in cap.calls} for d, cap in captures.items()}
    flat = list(iter_tensors(model_inputs))
    timer = Timer(config)
    sampler = Interleaved(timer, host.harness(False))
    for name, placement, _ in candidates:
        if trainer is None:
            runner = host.replay_runner(replay_fn(placement, calls_on, devices, plan, outputs, order), flat)
        else:
            runner = trainer.runner(placement, calls_on, plan, outputs, order, flat)
        sampler.add(name, runner)
    done: dict[Any, Measurement] = {}
    sampler.run(on_done=done.__setitem__)
    return [Verified(name, placement, predicted, done[name].summary(), done[name].status)
            for name, placement, predicted in candidates]


@dataclass
class SplitTraining:
    """What a split train step needs beyond the forward replay: the loss, optimizer, targets and gradient plan."""

    setup: TrainingSetup
    grad_inputs: dict[str, list[bool]]
    targets: list[Any]
    host: Device
    devices: dict[str, Device]

    def runner(self, placement: dict[str, str], calls_on: dict[str, dict[str, LayerCall]],
               plan: list[list[Source | None]], outputs: list[Source], order: list[str], flat: list[Any]) -> Any:
        steps = [PlacedStep(name, calls_on[placement[name]][name], self.devices[placement[name]], sources,
                            self.grad_inputs[name]) for name, sources in zip(order, plan)]
        last = next((placement[src[0]] for src in outputs if src[0] in placement), self.host.name)
        loss_device = self.devices[placement.get(LOSS_LAYER, last)]
        return self.host.split_train_runner(steps, outputs, flat, self.targets, self.setup.loss, loss_device,
                                            self.setup.make_optimizer)


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


@dataclass
class Verification:
    """A placement run for real against the single devices, from the same host inputs."""

    batch_size: int
    results: list[Verified]  # the recommendation first, then each single device
    placed_right: int  # layers whose ops ran on the device they were placed on
    layers: int

    @property
    def best_single(self) -> Verified:
        singles = self.results[1:]
        return min(singles, key=lambda r: r.measured.median_s) if singles else self.results[0]

    @property
    def verdict(self) -> str:
        return verdict(self.results[0], self.best_single)

    @property
    def table(self) -> pd.DataFrame:
        """Predicted and measured seconds per sample (with the CI) for each placement."""
        b = self.batch_size
        return pd.DataFrame([{
            "placement": r.name, "predicted_seconds_per_sample": r.predicted_seconds_per_batch / b,
            "measured_seconds_per_sample": r.measured.median_s / b, "ci_low_seconds_per_sample": r.measured.ci_low_s / b,
            "ci_high_seconds_per_sample": r.measured.ci_high_s / b,
            "relative_error": relative_error(r.predicted_seconds_per_batch, r.measured.median_s), "status": r.status,
        } for r in self.results])


def _devices_for(profile: Profile, rec: Recommendation) -> tuple[dict[str, Device], list[str]]:
    found = {d.name: d for d in backends.discover(profile.backend).devices}
    needed = sorted(set(rec.chosen.placement.values()) | {rec.data.host} |
                    {d for e in rec.single_devices for d in e.placement.values()})
    absent = [d for d in needed if d not in found]
    if absent:
        raise TbsError(f"--verify: device(s) {', '.join(absent)} of the profile are not on this machine "
                       f"(found {', '.join(found)}); set TBS_LOGICAL_CPUS as when profiling")
    return found, needed


def _models_on(profile: Profile, devices: dict[str, Device], custom_objects: dict[str, Any],
               safe_mode: bool, model: Any) -> dict[str, Any]:
    """One copy of the profiled model per device: from its file, or from the in-memory ``model``."""
    if model is not None:
        if not hasattr(model, "count_params"):
            raise TbsError(f"model: {type(model).__name__} is not a keras.Model; pass the model you profiled")
        source = ModelSource.of(model)  # pickled once for every device's copy
        return {name: d.fit_model(load_model_object(source, scope=d.scope).model) for name, d in devices.items()}
    recorded = profile.meta.model.get("path")
    if not recorded:
        raise TbsError("--verify replays the profiled model, and this profile was measured on an in-memory model: "
                       "pass it again (tbs.verify(p, rec, model=model)), or save it and profile the file")
    model_path = Path(recorded)
    if not model_path.is_file():
        raise TbsError(f"--verify needs the profiled model file '{model_path}' on this machine")
    return {name: d.fit_model(load_model(model_path, custom_objects, scope=d.scope, safe_mode=safe_mode).model)
            for name, d in devices.items()}


def _batch_of_inputs(profile: Profile, specs: list[Any], batch: int, arrays: Any) -> list[Any]:
    """The profile's inputs at ``batch``: synthetic with its seed, its --input file, or the arrays given."""
    source = str(profile.meta.input_source or "")
    if source.startswith(ARRAYS_INPUT):
        if arrays is None:
            raise TbsError("--verify needs the profile's input data: it was measured on in-memory arrays; "
                           "pass them again (tbs.verify(p, rec, input=arrays))")
        user = check_input_arrays(arrays, specs, "the input arrays")
    else:
        user = None if source.startswith(SYNTHETIC_INPUT) else load_user_input(Path(source), specs)
    return batch_arrays(specs, batch, int(profile.meta.seed or 0), user)


def _split_training(profile: Profile, reference: Capture, batch: int, devices: dict[str, Device],
                    custom_objects: dict[str, Any]) -> SplitTraining:
    setup = TrainingSetup.from_metadata(profile.meta.training, custom_objects)
    outputs = iter_tensors(reference.outputs)
    host = devices[profile.meta.host_device or next(iter(devices))]
    targets = setup.targets(outputs, batch, int(profile.meta.seed or 0))
    return SplitTraining(setup, gradient_plan(reference.calls), targets, host, devices)


def verify_recommendation(profile: Profile, rec: Recommendation, custom_objects: dict[str, Any] | None = None,
                          safe_mode: bool = True, model: Any = None, arrays: Any = None) -> Verification:
    """Run the recommended placement and the single devices for real; predicted against measured."""
    backends.choose(profile.backend)  # the profile's backend, before Keras is imported
    if profile.meta.merged_from:
        raise TbsError("--verify runs one machine's profile; pass a single profile directory")
    found, needed = _devices_for(profile, rec)
    host = found[rec.data.host]
    batch, training = rec.data.batch_size, profile.mode == "training"
    loaded = _models_on(profile, {d: found[d] for d in needed}, custom_objects or {}, safe_mode, model)
    specs = input_specs(loaded[host.name])
    host_inputs = host.place(structure_inputs(loaded[host.name], _batch_of_inputs(profile, specs, batch, arrays),
                                              specs))
    captures = {}
    for d in needed:
        with found[d].scope():
            captures[d] = capture(loaded[d], host_inputs if d == host.name else found[d].place(host_inputs),
                                  training, found[d], record_devices=True)
    by_name = {d: {c.name: c for c in cap.calls} for d, cap in captures.items()}
    layers = {name: d for name, d in rec.chosen.placement.items() if name != LOSS_LAYER}
    placed_right = sum(found[d].ran_here(by_name[d][name]) for name, d in layers.items())
    candidates = [("recommended", rec.chosen.placement, rec.chosen.seconds_per_batch)]
    candidates += [(e.name, e.placement, e.seconds_per_batch) for e in rec.single_devices]
    fields = TimingConfig.__dataclass_fields__
    config = TimingConfig(**{k: v for k, v in profile.meta.timing.items() if k in fields})
    # The loss the profile recorded may be a function of the user's (--custom-objects, or the model's compile()).
    objects = dict(custom_objects or {}, **dict(compile_objects(model) if model is not None else ()))
    trainer = _split_training(profile, captures[host.name], batch, found, objects) if training else None
    registration = neighbours.register(f"a --verify replay of {profile.directory}",
                                       lambda message: warnings.warn(message, TbsWarning, stacklevel=3))
    try:
        results = run(candidates, captures, host_inputs, found, host, config, trainer)
    finally:
        registration.close()
    return Verification(batch, results, placed_right, len(layers))
