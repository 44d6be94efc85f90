"""What a profile measures, beside ``TimingConfig`` (how each time is taken).

``tbs.profile`` takes the model, batch sizes, devices and prices directly; the rest
of a run's settings are these two small dataclasses, checked when they are built
(a wrong value is one TbsError line, not a failure mid-run). The same objects
travel from the API through ``tbs.run`` to every cluster node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tbs.errors import TbsError


def _flag(name: str, value: Any, hint: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TbsError(f"{name}={value!r}: give True or False ({hint})")


def _name(name: str, value: Any, example: str) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TbsError(f"{name}={value!r}: give a Keras {name} name such as {example}, or None for the model's own")


@dataclass(frozen=True)
class MeasureConfig:
    """What is measured besides each layer's time, and how the programs are built.

    ``analysis=False`` skips the compiler's FLOPs/bytes/memory per cell and the devices'
    calibration (faster on big models; no roofline, no predictions). ``dedupe=False``
    measures every layer call on its own instead of once per identical call (same type,
    configuration, shapes, device). ``capacity=True`` confirms each device's largest batch
    by real calls. ``xla=True`` compiles TensorFlow with XLA. ``seed`` makes the synthetic inputs.
    ``in_context=False`` skips tracing a few whole-model calls with the framework's profiler after their
    samples (each layer's in-model time, ops.csv and ``tbs report --format trace``).
    """

    xla: bool = False
    analysis: bool = True
    dedupe: bool = True
    capacity: bool = False
    seed: int = 0
    in_context: bool = True

    def __post_init__(self) -> None:
        _flag("xla", self.xla, "--xla")
        _flag("analysis", self.analysis, "--no-analysis")
        _flag("dedupe", self.dedupe, "--no-dedupe")
        _flag("capacity", self.capacity, "--capacity")
        _flag("in_context", self.in_context, "--no-in-context")
        if isinstance(self.seed, (bool, np.bool_)) or not isinstance(self.seed, (int, np.integer)):
            raise TbsError(f"seed={self.seed!r}: give a whole number (--seed)")


@dataclass(frozen=True)
class TrainingConfig:
    """A training profile's loss and optimizer, by Keras name.

    None means the model's own compiled one, else a stand-in (mean squared error or
    crossentropy fitted to the outputs; Adam). ``tbs.profile(training=True)`` is
    ``training=TrainingConfig()``.
    """

    loss: str | None = None
    optimizer: str | None = None

    def __post_init__(self) -> None:
        _name("loss", self.loss, "'mse'")
        _name("optimizer", self.optimizer, "'adam'")
