"""The one place that names a backend: one registry row per Keras backend that can measure.

Keras 3 reads ``KERAS_BACKEND`` once, at import, so the choice must be made
first; ``choose`` does that and ``keras()`` imports Keras with the chosen
backend's own logging kept quiet. Everything backend-specific lives in one
folder per backend, with the same file names in each (device, discovery,
environment, capture, training, split, analysis); neutral code reaches it
through this module and the ``Device`` interface, never through
``if backend == ...``. A backend is a row of ``REGISTRY``: its folder, the
framework module that must be installed, and what it can do. Every lookup goes
through ``backend(name)``, which refuses an unknown name with one line, so no
name falls through to another backend.

The JAX path never imports TensorFlow itself (the GPU machines that run JAX may
not have it); a model whose layers need TensorFlow (string preprocessing)
imports it through Keras, where it is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tbs.backends.base import Discovery
from tbs.backends.host import native_stderr_captured
from tbs.backends.tensorflow.environment import quiet_environment
from tbs.errors import TbsError
from tbs.schema import DEFAULT_BACKEND


@dataclass(frozen=True)
class Backend:
    """One Keras backend tbs can measure on, and what the rest of tbs needs to know about it."""

    name: str  # Keras's name for it (KERAS_BACKEND, --backend)
    package: str  # the folder holding its device, discovery, environment, capture, training, split, analysis
    requires: str  # the module that must be importable for the backend to be usable
    install: str  # how to install it, said when it is missing
    short: str  # its label in merged reports' device names ('tf:cpu:0')
    string_ops: bool  # runs TensorFlow string ops (TextVectorization) itself; else such calls are refused
    always_xla: bool  # compiles every program with XLA, --xla or not
    fused_gpu_rnn: tuple[str, ...] = ()  # recurrent layer types it runs on a GPU as one fused cuDNN kernel
    # A split forward pass replays as one program call per run of consecutive calls on one device (JAX: a jit cannot
    # span devices), each paying its device's dispatch; else as one program for the whole split (TensorFlow's graph).
    call_per_segment: bool = False

    def module(self, part: str) -> ModuleType:
        """This backend's ``part`` module (``discovery``, ``environment`` ...), imported on first use."""
        return importlib.import_module(f"{self.package}.{part}")


# Keras 3: TensorFlow picks cuDNN for LSTM/GRU with their default activations; on JAX, Keras runs the LSTM through
# cuDNN (jax.experimental.rnn: seen on an H200, where rnn_sa's LSTM priced as a loop read 3-3.7x its measured time)
# and every other RNN as a loop (JAX has no cuDNN GRU).
REGISTRY: dict[str, Backend] = {b.name: b for b in (
    Backend("tensorflow", "tbs.backends.tensorflow", requires="tensorflow", install="pip install tensorflow",
            short="tf", string_ops=True, always_xla=False, fused_gpu_rnn=("LSTM", "GRU")),
    Backend("jax", "tbs.backends.jax", requires="jaxlib", install="pip install 'tbs[jax]'",
            short="jax", string_ops=False, always_xla=True, fused_gpu_rnn=("LSTM",), call_per_segment=True),
)}
BACKENDS = tuple(REGISTRY)
# The files every backend's folder has (a backend may add its own, as tensorflow/loop.py).
FILES = ("device.py", "discovery.py", "environment.py", "capture.py", "training.py", "split.py", "analysis.py")
DEFAULT = DEFAULT_BACKEND  # "tensorflow": what measures when no --backend is given (and old profiles ran on)


def backend(name: str) -> Backend:
    """The registry row of ``name``; an unknown name is refused with one line listing the known ones."""
    found = REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        raise TbsError(f"--backend: unknown backend '{name}'; choose from {', '.join(BACKENDS)}")
    return found


def check(name: str) -> None:
    """Refuse an unknown backend name with one line (before anything slow)."""
    backend(name)


def fused_gpu_rnn_types(name: str) -> tuple[str, ...]:
    """The layer types ``name`` runs as a fused cuDNN kernel on a GPU (the GPU model prices the rest as loops)."""
    row = REGISTRY.get(name)  # a profile's recorded backend: one no row has runs no fused kernel
    return row.fused_gpu_rnn if row else ()


def compiles_every_program(name: str) -> bool:
    """Whether ``name`` runs every program compiled (XLA), so a recurrent loop's kernels are launched by the
    program itself, back to back, not one by one by the framework."""
    row = REGISTRY.get(name)
    return bool(row and row.always_xla)


def installed(name: str) -> str | None:
    """Why a backend cannot be used here, or None if it can."""
    row = backend(name)
    try:
        found = importlib.util.find_spec(row.requires) is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or a half-removed package: not usable
        found = False
    return None if found else f"{name} is not installed ({row.install})"


def current() -> str:
    """The backend Keras uses (or will use once imported)."""
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
        return sys.modules["keras"].backend.backend()
    return os.environ.get("KERAS_BACKEND", DEFAULT)


def choose(name: str) -> None:
    """Make ``name`` the Keras backend; must happen before Keras is imported in this process."""
    row = backend(name)
    missing = installed(name)
    if missing:
        raise TbsError(f"--backend {name}: {missing}")
    if "keras" in sys.modules and current() != name:
        raise TbsError(
            f"--backend {name}: Keras is already running on {current()} in this process; run tbs in a new process"
        )
    os.environ["KERAS_BACKEND"] = name
    row.module("environment").configure()


def prepare_discovery() -> None:
    """Settings every backend must see before it starts (``tbs devices`` lists them all)."""
    for row in REGISTRY.values():
        row.module("environment").configure()


def keras() -> ModuleType:
    """The keras (3.x) module on the chosen backend, imported quietly (once)."""
    if hasattr(sys.modules.get("keras"), "backend"):
        return sys.modules["keras"]
    quiet_environment()  # Keras may import TensorFlow on any backend (lazily, in its serialization)
    row = REGISTRY.get(current())  # KERAS_BACKEND may name a backend tbs does not measure on: Keras decides
    if "keras" not in sys.modules and row is not None:
        row.module("environment").before_keras()
    with warnings.catch_warnings(), native_stderr_captured():
        warnings.simplefilter("ignore")
        import keras
    return keras


def discover(name: str) -> Discovery:
    """The devices one Keras backend can use here, and why the missing kinds are missing."""
    return backend(name).module("discovery").discover()


def environment(name: str, xla: bool) -> dict[str, Any]:
    """What a profile records about the backend: versions, settings, and whether XLA compiled it."""
    row = backend(name)
    env = row.module("environment")
    return {"versions": env.versions(), "settings": env.settings(xla), "xla": row.always_xla or bool(xla)}


def short(name: str) -> str:
    """'tensorflow' -> 'tf' (device labels in merged reports); a name no backend has is kept as it is."""
    row = REGISTRY.get(name)
    return row.short if row else name
