"""Fakes that run the real profiler without TensorFlow, JAX or Keras: scripted devices on a fake clock.

``FakeDevice`` compiles a call the way XLA and tf.function do, by tracing it once
with a ``Tracer`` in place of every tensor: the ``FakeLayer``s (and the
``FakeModel``) it flows through sign it, so the device learns which layer, or the
whole model, it compiled. Each ``runner(n)`` then advances a shared ``FakeClock``
by the harness's own cost plus n times that target's scripted seconds. Order of
cells, interleaving, resume, failure rows and the ETA are then exact and take
milliseconds; no framework is ever imported (``tests/test_fake_profiler.py``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tbs.backends.base import Device
from tbs.capture.recorder import Capture, Edge, LayerCall
from tbs.load.inputs import InputSpec
from tbs.load.model import LoadedModel
from tbs.measure.profiler import Profiler
from tbs.measure.request import ProfileRequest, Progress
from tbs.measure.timing import Interrupted, TimingConfig
from tbs.profiles.profile import Profile, load_profile
from tbs.profiles.store import ProfileStore, finalize
from tbs.endpoints import GRAPH_OUTPUT, input_endpoint
from tbs.schema import FORMAT_VERSION, MODEL_LAYER, ProfileStatus

Script = Mapping[str, float | Callable[[int], float]]  # seconds per call, or a function of the batch size
HARNESS = "(harness)"  # the target of the empty loop every device times to subtract its own cost
INPUT_WIDTH = 4
# Fast statistics on fake time: deterministic samples are tight at min_samples; a short span suffices.
FAKE_TIMING = TimingConfig(min_samples=10, min_span_seconds=0.1)


@dataclass(frozen=True)
class RunEvent:
    """One compile (iterations 0) or one ``runner(n)`` on a fake device, in the order they happened."""

    device: str
    target: str  # a layer's name, MODEL_LAYER or HARNESS
    batch: int | None  # None for the harness, which takes no batch
    iterations: int
    at: float  # fake time when it started


class FakeClock:
    """Fake seconds, which pass only when a fake device works; also the log of that work."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.events: list[RunEvent] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self.now += seconds

    def runs(self, device: str | None = None, target: str | None = None,
             batch: int | None = None) -> list[RunEvent]:
        """The runner calls (not compiles) matching every filter given."""
        return [e for e in self.events if e.iterations > 0 and _matches(e, device, target, batch)]

    def compiles(self, device: str | None = None, target: str | None = None,
                 batch: int | None = None) -> list[RunEvent]:
        """The compiles matching every filter given (one per measured cell, plus the harness)."""
        return [e for e in self.events if e.iterations == 0 and _matches(e, device, target, batch)]


def _matches(event: RunEvent, device: str | None, target: str | None, batch: int | None) -> bool:
    return ((device is None or event.device == device) and (target is None or event.target == target)
            and (batch is None or event.batch == batch))


class Tracer:
    """Stands in for every tensor while a fake device compiles a call; the ops it meets sign it."""

    def __init__(self, batch: int | None) -> None:
        self.batch = batch
        self.ops: list[str] = []


class FakeLayer:
    """A named leaf layer: eagerly it returns zeros of its width; traced, it signs the tracer."""

    def __init__(self, name: str, units: int = INPUT_WIDTH, layer_type: str = "Dense",
                 category: str = "dense", params: int = 0) -> None:
        self.name, self.units, self.layer_type = name, units, layer_type
        self.category, self.params = category, params
        self.variables: list[Any] = []

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        tracer = next((x for x in inputs if isinstance(x, Tracer)), None)
        if tracer is not None:
            tracer.ops.append(self.name)
            return tracer
        return np.zeros((int(np.shape(inputs[0])[0]), self.units), np.float32)


class FakeModel:
    """Layers in topological order wired as a chain, or as ``inputs_of`` says (a small DAG)."""

    def __init__(self, layers: Sequence[FakeLayer], inputs_of: Mapping[str, Sequence[str]] | None = None,
                 name: str = "fake", input_name: str = "x") -> None:
        self.layers, self.name, self.input_name = list(layers), name, input_name
        self.input = input_endpoint(input_name)
        previous = [self.input] + [layer.name for layer in self.layers[:-1]]
        self.inputs_of = {layer.name: [src] for layer, src in zip(self.layers, previous)}
        self.inputs_of.update({k: list(v) for k, v in (inputs_of or {}).items()})
        self.variables: list[Any] = []

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        if isinstance(inputs, Tracer):
            inputs.ops.append(MODEL_LAYER)  # first, so a device tells the model from its first layer
        return self.values(inputs)[self.layers[-1].name]

    def values(self, inputs: Any) -> dict[str, Any]:
        """Every layer's output (and the input), by name."""
        values = {self.input: inputs}
        for layer in self.layers:
            values[layer.name] = layer(*[values[src] for src in self.inputs_of[layer.name]])
        return values


def chain(*names: str, units: int = INPUT_WIDTH) -> FakeModel:
    """A Sequential-like fake model of the named layers."""
    return FakeModel([FakeLayer(name, units) for name in names])


class FakeDevice(Device):
    """A device whose work is scripted: seconds per call of each layer by name (or a function of the batch).

    ``seconds_per_call[MODEL_LAYER]`` scripts the whole model (default: the sum of the
    layers it traced). ``failures`` raise when a target is compiled; ``run_failures``
    (``name -> (k, exception)``) from its runner's call k+1 (calibration makes at least
    two, so k >= 2 fails while sampling); ``capture_failures`` (``batch -> exception``)
    in the eager capture pass, which fails that whole (batch, device) group.
    """

    backend = "fake"

    def __init__(self, kind: str, index: int, clock: FakeClock, seconds_per_call: Script,
                 failures: Mapping[str, BaseException] | None = None,
                 run_failures: Mapping[str, tuple[int, BaseException]] | None = None,
                 capture_failures: Mapping[int, BaseException] | None = None, *,
                 default_seconds: float = 1e-3, harness_call_seconds: float = 2e-5,
                 harness_iteration_seconds: float = 1e-6, compile_seconds: float = 0.05,
                 copy_seconds: float = 1e-4, overlap: float | None = None) -> None:
        super().__init__(kind, index, description=f"fake {kind}")
        self.clock, self.script = clock, dict(seconds_per_call)
        self.failures, self.run_failures = dict(failures or {}), dict(run_failures or {})
        self.capture_failures = dict(capture_failures or {})
        self.default_seconds, self.compile_seconds, self.copy_seconds = default_seconds, compile_seconds, copy_seconds
        self.harness_call_seconds, self.harness_iteration_seconds = harness_call_seconds, harness_iteration_seconds
        self.overlap = overlap  # calls back to back take this share of one call's time; None: not timed

    def seconds(self, target: str, batch: int | None, layers: Sequence[str] = ()) -> float:
        """Scripted seconds of one call of ``target`` (the model: of the ``layers`` it ran, unless scripted)."""
        if target == HARNESS:
            return 0.0
        if target == MODEL_LAYER and MODEL_LAYER not in self.script:
            return sum(self.seconds(name, batch) for name in layers)
        value = self.script.get(target, self.default_seconds)
        return float(value(batch or 1) if callable(value) else value)

    def scope(self) -> AbstractContextManager:
        return nullcontext()

    def place(self, structure: Any) -> Any:
        self.clock.advance(self.copy_seconds)
        return structure

    def sync(self) -> None:
        """Fake work is finished when its runner returns."""

    def compile_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                        variables: Sequence[Any] = (), outputs_written: bool = False) -> Callable[[int], None]:
        """Trace ``call`` once, as XLA does, to learn what it runs; the runner then costs its script."""
        target, batch, work = self._traced(call, tensors)
        self.clock.events.append(RunEvent(self.name, target, batch, 0, self.clock()))
        if target in self.failures:
            raise self.failures[target]
        return self._runner(target, batch, work)

    def _traced(self, call: Callable[..., Any], tensors: list[Any]) -> tuple[str, int | None, float]:
        """What ``call`` runs (its first op names it), at what batch, and its scripted seconds per call."""
        tracer = Tracer(_batch_of(tensors))
        call(*[tracer] * len(tensors))
        target = tracer.ops[0] if tracer.ops else HARNESS
        return target, tracer.batch, self.seconds(target, tracer.batch, tracer.ops[1:])

    def overlapped_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                           variables: Sequence[Any] = ()) -> Callable[[int], None] | None:
        """Calls back to back, each ``overlap`` of one call's scripted time (``overlap=None``: none)."""
        if self.overlap is None:
            return None
        target, batch, work = self._traced(call, tensors)
        return self._runner(f"{target} back to back", batch, work * self.overlap)

    def _runner(self, target: str, batch: int | None, work: float) -> Callable[[int], None]:
        """``runner(n)``: the harness's fixed cost, plus n iterations of (harness step + work), on the clock."""
        succeed, error = self.run_failures.get(target, (None, None))
        calls = [0]

        def runner(n: int) -> None:
            self.clock.events.append(RunEvent(self.name, target, batch, n, self.clock()))
            calls[0] += 1
            if error is not None and calls[0] > succeed:
                raise error
            first = self.compile_seconds if calls[0] == 1 else 0.0  # tracing happens on the first call
            self.clock.advance(first + self.harness_call_seconds + n * (self.harness_iteration_seconds + work))

        return runner

    def eager_pass(self, names: Sequence[str], batch: int) -> list[float]:
        """The eager capture's seconds per layer (its scripted per-call seconds), with the clock advanced."""
        if batch in self.capture_failures:
            raise self.capture_failures[batch]
        seconds = [self.seconds(name, batch) for name in names]
        self.clock.advance(sum(seconds))
        return seconds

    def run_placed(self, call: Any, args: tuple, kwargs: dict) -> Any:
        self.clock.advance(self.seconds(call.name, _batch_of(list(args))))
        return call.invoke(*args, **kwargs)

    def replay_runner(self, replay: Callable[..., Any], tensors: list[Any]) -> Callable[[int], None]:
        raise NotImplementedError("placement replays are not faked (tbs.testing fakes measuring only)")

    def ran_here(self, call: Any) -> bool:
        return True


def _batch_of(tensors: Sequence[Any]) -> int | None:
    return next((int(np.shape(x)[0]) for x in tensors if np.ndim(x) > 0), None)


def fake_tensors(structure: Any) -> list[Any]:
    """The arrays (and tracers) in nested tuples, lists and dicts, in order: ``iter_tensors`` without Keras."""
    if isinstance(structure, (np.ndarray, Tracer)):
        return [structure]
    if isinstance(structure, dict):
        return [x for value in structure.values() for x in fake_tensors(value)]
    if isinstance(structure, (list, tuple)):
        return [x for value in structure for x in fake_tensors(value)]
    return []


def fake_rebuild(structure: Any, tensors: list[Any]) -> Any:
    """``structure`` with its tensors, in ``fake_tensors`` order, replaced: ``replace_tensors`` without Keras."""
    remaining = iter(tensors)

    def swap(value: Any) -> Any:
        if isinstance(value, (np.ndarray, Tracer)):
            return next(remaining)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    return swap(structure)


def fake_capture(model: FakeModel, inputs: Any, training: bool, device: Device | None = None,
                 record_devices: bool = False) -> Capture:
    """The eager pass of a FakeModel, recorded the way ``capture.recorder.capture`` records Keras's."""
    batch = int(np.shape(inputs)[0])
    names = [layer.name for layer in model.layers]
    eager = device.eager_pass(names, batch) if isinstance(device, FakeDevice) else [0.0] * len(names)
    values = model.values(inputs)
    calls: list[LayerCall] = []
    edges: list[Edge] = []
    for layer, seconds in zip(model.layers, eager):
        sources = list(dict.fromkeys(model.inputs_of[layer.name]))
        args, out = tuple(values[src] for src in model.inputs_of[layer.name]), values[layer.name]
        edges += [_edge(src, layer.name, values[src]) for src in sources]
        calls.append(LayerCall(
            name=layer.name, op=layer, type=layer.layer_type, category=layer.category,
            params=layer.params, args=args, kwargs={}, outputs=out,
            input_shapes=[list(x.shape) for x in args], output_shapes=[list(out.shape)],
            input_bytes=sum(int(x.nbytes) for x in args), output_bytes=int(out.nbytes), eager_seconds=seconds))
    last = model.layers[-1].name
    edges.append(_edge(last, GRAPH_OUTPUT, values[last]))
    return Capture(calls=calls, edges=edges, outputs=values[last])


def _edge(src: str, dst: str, x: np.ndarray) -> Edge:
    return Edge(src, dst, list(x.shape), x.dtype.name, int(x.nbytes))


class RecordingProgress(Progress):
    """Keeps every estimate of the time left that the profiler reports, with the fake time of each."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.estimates: list[tuple[float, float]] = []  # (fake time, remaining seconds)
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def start(self, remaining_seconds: float) -> None:
        self.started_at = self.clock()
        self.estimates.append((self.started_at, remaining_seconds))

    def advance(self, label: str, remaining_seconds: float) -> None:
        self.estimates.append((self.clock(), remaining_seconds))

    def finish(self) -> None:
        self.finished_at = self.clock()


def fake_request(model: FakeModel, devices: Sequence[FakeDevice], batch_sizes: Sequence[int],
                 config: TimingConfig = FAKE_TIMING, training: bool = False) -> ProfileRequest:
    """A ProfileRequest for the fakes: real synthetic inputs, fake capture and tensor walking."""
    loaded = LoadedModel(model=model, path=None, name=model.name, sha256=f"fake-{model.name}", format="fake")
    return ProfileRequest(
        loaded=loaded, load_on=lambda device: loaded, devices=list(devices), batch_sizes=list(batch_sizes),
        training=training, specs=[InputSpec(model.input_name, (INPUT_WIDTH,), "float32")],
        user_arrays=None, config=config, xla=True, host="fakehost",
        capture_fn=fake_capture, tensors_fn=fake_tensors, rebuild_fn=fake_rebuild)


def fake_metadata(request: ProfileRequest) -> dict[str, Any]:
    """What ``tbs profile`` would write to metadata.json before measuring, for the fakes."""
    return {"tbs_profile_version": FORMAT_VERSION, "model": request.loaded.describe(), "mode": request.mode,
            "batch_sizes": list(request.batch_sizes), "devices": [d.as_dict() for d in request.devices],
            "backend": "fake", "host": {"hostname": request.host}, "timing": asdict(request.config)}


def fake_profile(directory: str | Path, model: FakeModel, devices: Sequence[FakeDevice],
                 batch_sizes: Sequence[int] = (8, 64), *, config: TimingConfig = FAKE_TIMING,
                 progress: Progress | None = None, should_stop: Callable[[], bool] = lambda: False,
                 resume: bool = False) -> Profile:
    """Profile ``model`` on fake devices into ``directory`` with the real Profiler and ProfileStore.

    Stopped by ``should_stop``: the profile is left ``interrupted`` (as ``tbs.api`` leaves it),
    for ``resume=True`` to finish. Otherwise it is finalized. Returns the profile as loaded.
    """
    request = fake_request(model, devices, batch_sizes, config)
    store = ProfileStore(Path(directory))
    if resume:
        store.resume(fake_metadata(request))
    else:
        store.create(fake_metadata(request))
    profiler = Profiler(request, store, progress or Progress(), should_stop, clock=devices[0].clock)
    try:
        profiler.run()
    except Interrupted:
        store.finish(ProfileStatus.INTERRUPTED)
        return load_profile(store.directory)
    return finalize(store)
