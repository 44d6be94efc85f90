"""What a profile must record about where and how it was measured."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import sys
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("tbs", "keras", "numpy", "pandas", "scipy", "plotly", "click", "cloudpickle")


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo (or platform on other systems)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def library_versions(backend: str = "tensorflow") -> dict[str, str]:
    """Versions of what measured (TensorFlow from the module: it ships as several distributions)."""
    versions = {"python": sys.version.split()[0]}
    if backend == "tensorflow":
        from tbs.tfenv import tensorflow

        tf = tensorflow()
        versions["tensorflow"] = tf.__version__
        build = tf.sysconfig.get_build_info()
        if build.get("cuda_version"):
            versions["cuda"] = str(build["cuda_version"])
            versions["cudnn"] = str(build.get("cudnn_version"))
        packages = _PACKAGES
    else:
        packages = _PACKAGES + ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu")
    for name in packages:
        try:
            versions[name] = _metadata.version(name)
        except _metadata.PackageNotFoundError:
            continue
    return versions


def threading_settings(jit: bool, backend: str = "tensorflow") -> dict[str, Any]:
    """CPU threading, oneDNN and XLA choices: they change timings, so they travel with them."""
    common = {"cpu_count": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    if backend == "jax":
        return dict(common, xla_jit_compile="always (jax.jit)", xla_flags=os.environ.get("XLA_FLAGS"),
                    jax_platforms=os.environ.get("JAX_PLATFORMS"),
                    preallocate=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default (true)"))
    from tbs.tfenv import tensorflow

    tf = tensorflow()
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return dict(
        common,
        intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads() or "default (all cores)",
        inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads() or "default",
        onednn="off" if onednn == "0" else ("on" if onednn == "1" else "default (on for x86 builds)"),
        xla_jit_compile=bool(jit),
        tf_xla_flags=os.environ.get("TF_XLA_FLAGS"),
        grappler="default",
    )


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
