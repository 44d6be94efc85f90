"""Which Keras backend measures (TensorFlow or JAX), chosen before Keras is imported.

Keras 3 reads ``KERAS_BACKEND`` once, at import, so the choice must be made
first; ``choose`` does that and ``keras()`` imports Keras with the chosen
backend's own logging kept quiet. The JAX path never imports TensorFlow itself
(the GPU machines that run JAX may not have it); a model whose layers need
TensorFlow (string preprocessing) imports it through Keras, where it is installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from types import ModuleType

from tbs.errors import TbsError
from tbs.tfenv import native_stderr_captured, quiet_environment
from tbs.tfenv import tensorflow as _tensorflow

BACKENDS = ("tensorflow", "jax")
SHORT_NAMES = {"tensorflow": "tf", "jax": "jax"}


def installed(name: str) -> str | None:
    """Why a backend cannot be used here, or None if it can."""
    module = {"tensorflow": "tensorflow", "jax": "jaxlib"}[name]
    if importlib.util.find_spec(module) is None:
        extra = "pip install 'tbs[jax]'" if name == "jax" else "pip install tensorflow"
        return f"{name} is not installed ({extra})"
    return None


def current() -> str:
    """The backend Keras uses (or will use once imported)."""
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
        return sys.modules["keras"].backend.backend()
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def choose(name: str) -> None:
    """Make ``name`` the Keras backend; must happen before Keras is imported in this process."""
    if name not in BACKENDS:
        raise TbsError(f"--backend: unknown backend '{name}'; choose from {', '.join(BACKENDS)}")
    missing = installed(name)
    if missing:
        raise TbsError(f"--backend {name}: {missing}")
    if "keras" in sys.modules and current() != name:
        raise TbsError(
            f"--backend {name}: Keras is already running on {current()} in this process; run tbs in a new process"
        )
    os.environ["KERAS_BACKEND"] = name
    if name == "jax":
        jax_environment()


def jax_environment() -> None:
    """Settings JAX reads once, when it starts: TBS_LOGICAL_CPUS=N gives N CPU devices.

    This is the JAX analogue of splitting TensorFlow's host CPU into logical devices.
    """
    logical_cpus = os.environ.get("TBS_LOGICAL_CPUS", "")
    flags = os.environ.get("XLA_FLAGS", "")
    if logical_cpus.isdigit() and int(logical_cpus) > 1 and "host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={logical_cpus}".strip()


def keras() -> ModuleType:
    """The keras (3.x) module on the chosen backend, imported quietly."""
    quiet_environment()
    if "keras" not in sys.modules and current() == "tensorflow":
        _tensorflow()
    with warnings.catch_warnings(), native_stderr_captured():
        warnings.simplefilter("ignore")
        import keras
    return keras


def short(name: str) -> str:
    """'tensorflow' -> 'tf' (device labels in merged reports)."""
    return SHORT_NAMES.get(name, name)
