"""What a profiling run asks the profiler for, and the two things it reports to: progress and a cell sink."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from tbs.backends.base import Device
from tbs.backends.tensors import iter_tensors, replace_tensors
from tbs.capture.recorder import Capture, capture
from tbs.load.inputs import InputSpec, batch_arrays
from tbs.load.model import LoadedModel
from tbs.load.train_setup import TrainingSetup
from tbs.measure.timing import TimingConfig
from tbs.schema import CellKey, LayerRecord, Metadata


class Progress:
    """What the profiler reports while it works (the CLI draws a bar; tests ignore it)."""

    def start(self, remaining_seconds: float) -> None: ...

    def advance(self, label: str, remaining_seconds: float) -> None:
        """A cell finished; the rest is now estimated to take remaining_seconds."""

    def describe(self, label: str) -> None: ...

    def finish(self) -> None: ...


class CellSink(Protocol):
    """Where finished cells go, as they finish (``profiles.store.ProfileStore`` on disk)."""

    metadata: dict[str, Any]

    def is_done(self, key: CellKey) -> bool: ...

    def add_cell(self, key: CellKey, row: dict[str, Any], samples: list[dict[str, Any]],
                 analysis: list[dict[str, Any]] = ..., ops: list[dict[str, Any]] = ...) -> None: ...

    def add_transfers(self, rows: list[dict[str, Any]]) -> None: ...

    def update_metadata(self, **values: Any) -> None: ...

    @property
    def meta(self) -> Metadata: ...

    @property
    def layers(self) -> list[LayerRecord]: ...

    def set_layers(self, records: list[LayerRecord]) -> None: ...


def _unpriced(row: dict[str, Any]) -> dict[str, Any]:
    return row


@dataclass
class ProfileRequest:
    loaded: LoadedModel
    load_on: Callable[[Device], LoadedModel]
    devices: list[Device]
    batch_sizes: list[int]
    training: bool
    specs: list[InputSpec]
    user_arrays: list[np.ndarray] | None
    config: TimingConfig
    xla: bool
    host: str
    seed: int = 0
    models: dict[str, Any] = field(default_factory=dict)
    host_device: Device | None = None  # the host CPU when no CPU is profiled (inputs start there)
    training_setup: TrainingSetup | None = None  # the loss and optimizer a training profile times
    capacity: bool = False  # after timing, search each device's largest batch that fits by real calls
    analysis: bool = True  # analyse every program (FLOPs, bytes, memory) and calibrate every device
    dedupe: bool = True  # identical layer calls (same programs) measured once, the others sharing its row
    in_context: bool = True  # trace a few whole-model calls after their samples: each layer's in-model time
    # Adds a row's price and cost per sample (the cost stage's; measuring never turns seconds into dollars).
    price_row: Callable[[dict[str, Any]], dict[str, Any]] = _unpriced
    # How the eager pass is recorded and a call's tensors are found and put back: Keras's by
    # default; tbs.testing swaps in fakes so the profiler runs without any framework.
    capture_fn: Callable[..., Capture] = capture
    tensors_fn: Callable[[Any], list[Any]] = iter_tensors
    rebuild_fn: Callable[[Any, list[Any]], Any] = replace_tensors

    @property
    def mode(self) -> str:
        return "training" if self.training else "inference"

    def model_on(self, device: Device) -> Any:
        if device.name not in self.models:
            self.models[device.name] = (
                self.loaded.model if device is self.devices[0] else self.load_on(device).model
            )
        return self.models[device.name]

    def host_inputs(self, batch_size: int) -> list[np.ndarray]:
        return batch_arrays(self.specs, batch_size, self.seed, self.user_arrays)
