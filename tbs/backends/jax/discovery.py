"""JAX's devices on this host: the CPU (several with TBS_LOGICAL_CPUS), each GPU and TPU from ``jax.devices``."""

from __future__ import annotations

import importlib.util
import logging
import os

from tbs.backends.base import Device, Discovery
from tbs.backends.host import cpu_model, total_memory_bytes
from tbs.backends.jax.device import JaxDevice
from tbs.backends.jax.environment import jax as _jax


def _missing_reason(platform: str, exc: BaseException | None) -> str:
    plugins = {"gpu": ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin"),
               "tpu": ("libtpu",)}[platform]
    if not any(importlib.util.find_spec(p) for p in plugins):
        extra = "jax[cuda12]" if platform == "gpu" else "jax[tpu]"
        return f"no {platform.upper()}: this jaxlib has no {platform.upper()} plugin (pip install '{extra}')"
    first = str(exc).splitlines()[0] if exc and str(exc) else "none found"
    return f"no {platform.upper()} visible to JAX: {first}"


def discover() -> Discovery:
    """Every JAX device on this host, plus why each missing kind is missing.

    ``TBS_LOGICAL_CPUS=N`` gives N CPU devices (set up by ``backend.choose``).
    """
    jax = _jax()
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
    devices: list[Device] = []
    missing: dict[str, str] = {}
    cores = os.cpu_count() or 0
    for i, d in enumerate(jax.devices("cpu")):
        devices.append(JaxDevice("cpu", i, d, f"{cpu_model()} ({cores} cores)", total_memory_bytes()))
    for kind in ("gpu", "tpu"):
        try:
            found = jax.devices(kind)
        except RuntimeError as exc:
            missing[kind] = _missing_reason(kind, exc)
            continue
        for i, d in enumerate(found):
            stats = d.memory_stats() if hasattr(d, "memory_stats") else None
            devices.append(JaxDevice(kind, i, d, str(d.device_kind), (stats or {}).get("bytes_limit")))
        if not found:
            missing[kind] = _missing_reason(kind, None)
    return Discovery(devices=devices, missing=missing)
