"""The one place that names a backend: which Keras backend measures (TensorFlow or JAX).

Keras 3 reads ``KERAS_BACKEND`` once, at import, so the choice must be made
first; ``choose`` does that and ``keras()`` imports Keras with the chosen
backend's own logging kept quiet. Everything backend-specific lives in
``tensorflow/`` and ``jax/`` (identical file names: device, discovery,
environment, capture); neutral code reaches it through this module and the
``Device`` interface, never through ``if backend == ...``. The JAX path never
imports TensorFlow itself (the GPU machines that run JAX may not have it); a
model whose layers need TensorFlow (string preprocessing) imports it through
Keras, where it is installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from types import ModuleType
from typing import Any

from tbs.backends.base import Discovery
from tbs.backends.tensorflow.environment import native_stderr_captured, quiet_environment
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow
from tbs.errors import TbsError
from tbs.schema import DEFAULT_BACKEND

BACKENDS = ("tensorflow", "jax")
DEFAULT = DEFAULT_BACKEND  # "tensorflow": what measures when no --backend is given (and old profiles ran on)
SHORT_NAMES = {"tensorflow": "tf", "jax": "jax"}
_MODULES = {"tensorflow": "tensorflow", "jax": "jaxlib"}
_INSTALL = {"tensorflow": "pip install tensorflow", "jax": "pip install 'tbs[jax]'"}


# Recurrent layer types a backend runs on a GPU as one fused cuDNN kernel (Keras 3: TensorFlow picks
# cuDNN for LSTM/GRU with their default activations; JAX runs every RNN as a loop of kernels).
_FUSED_GPU_RNN = {"tensorflow": ("LSTM", "GRU"), "jax": ()}


def fused_gpu_rnn_types(name: str) -> tuple[str, ...]:
    """The layer types ``name`` runs as a fused cuDNN kernel on a GPU (the GPU model prices the rest as loops)."""
    return _FUSED_GPU_RNN.get(name, ())


def installed(name: str) -> str | None:
    """Why a backend cannot be used here, or None if it can."""
    try:
        found = importlib.util.find_spec(_MODULES[name]) is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or a half-removed package: not usable
        found = False
    return None if found else f"{name} is not installed ({_INSTALL[name]})"


def current() -> str:
    """The backend Keras uses (or will use once imported)."""
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
        return sys.modules["keras"].backend.backend()
    return os.environ.get("KERAS_BACKEND", DEFAULT)


def check(name: str) -> None:
    """Refuse an unknown backend name with one line (before anything slow)."""
    if name not in BACKENDS:
        raise TbsError(f"--backend: unknown backend '{name}'; choose from {', '.join(BACKENDS)}")


def choose(name: str) -> None:
    """Make ``name`` the Keras backend; must happen before Keras is imported in this process."""
    check(name)
    missing = installed(name)
    if missing:
        raise TbsError(f"--backend {name}: {missing}")
    if "keras" in sys.modules and current() != name:
        raise TbsError(
            f"--backend {name}: Keras is already running on {current()} in this process; run tbs in a new process"
        )
    os.environ["KERAS_BACKEND"] = name
    _environment(name).configure()


def _environment(name: str) -> Any:
    if name == "jax":
        from tbs.backends.jax import environment
    else:
        from tbs.backends.tensorflow import environment
    return environment


def prepare_discovery() -> None:
    """Settings every backend must see before it starts (``tbs devices`` lists them all)."""
    for name in BACKENDS:
        _environment(name).configure()


def keras() -> ModuleType:
    """The keras (3.x) module on the chosen backend, imported quietly (once)."""
    if hasattr(sys.modules.get("keras"), "backend"):
        return sys.modules["keras"]
    quiet_environment()
    if "keras" not in sys.modules and current() == "tensorflow":
        _tensorflow()
    with warnings.catch_warnings(), native_stderr_captured():
        warnings.simplefilter("ignore")
        import keras
    return keras


def discover(name: str) -> Discovery:
    """The devices one Keras backend can use here, and why the missing kinds are missing."""
    if name == "jax":
        from tbs.backends.jax.discovery import discover as found
    else:
        from tbs.backends.tensorflow.discovery import discover as found
    return found()


def environment(name: str, xla: bool) -> dict[str, Any]:
    """What a profile records about the backend: versions, settings, and whether XLA compiled it."""
    env = _environment(name)
    return {"versions": env.versions(), "settings": env.settings(xla), "xla": env.compiles_with_xla(xla)}


def short(name: str) -> str:
    """'tensorflow' -> 'tf' (device labels in merged reports)."""
    return SHORT_NAMES.get(name, name)
