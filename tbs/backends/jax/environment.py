"""JAX's environment: settings it reads once at start, and its versions and settings for the profile."""

from __future__ import annotations

import os
from typing import Any

from tbs.backends.host import common_settings, package_versions

_PLUGINS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu")


def configure() -> None:
    """Settings JAX reads once, when it starts: TBS_LOGICAL_CPUS=N gives N CPU devices.

    This is the JAX analogue of splitting TensorFlow's host CPU into logical devices.
    """
    logical_cpus = os.environ.get("TBS_LOGICAL_CPUS", "")
    flags = os.environ.get("XLA_FLAGS", "")
    if logical_cpus.isdigit() and int(logical_cpus) > 1 and "host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={logical_cpus}".strip()


def versions() -> dict[str, str]:
    return package_versions(_PLUGINS)


def settings(xla: bool) -> dict[str, Any]:
    return dict(common_settings(), xla_jit_compile="always (jax.jit)", xla_flags=os.environ.get("XLA_FLAGS"),
                jax_platforms=os.environ.get("JAX_PLATFORMS"),
                preallocate=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default (true)"))


def before_keras() -> None:
    """Nothing to import first: JAX logs nothing at import that a user should not see."""


def jax() -> Any:
    """The jax module (imported on first use, so that choosing the backend imports nothing)."""
    import jax as module

    return module
