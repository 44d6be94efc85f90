"""Import TensorFlow quietly, once (Keras itself is imported by ``tbs.backends``).

TensorFlow prints C++ log lines at import; a user's terminal should show only
tbs's own output and one-line errors. Imports are lazy so that argument errors
are reported before the (slow) TensorFlow import.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from types import ModuleType
from typing import Any

from tbs.backends.host import common_settings, native_stderr_captured, package_versions


def quiet_environment() -> None:
    """Environment variables that must be set before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "2")


_MODULE: ModuleType | None = None  # TensorFlow, once tbs has quieted it


def tensorflow() -> ModuleType:
    """The tensorflow module, imported with its logs silenced; cached after the first call.

    Traced code calls this too (every TensorFlow helper here does), so after the first call it
    touches nothing but the cache: AutoGraph converts what a traced function calls, and an
    ``os.environ`` call inside it printed every environment variable (secrets included) to stderr.
    TensorFlow's Python loggers are quieted whether tbs imported it or the user did before.
    """
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    quiet_environment()
    if "tensorflow" in sys.modules:
        import tensorflow as tf
    else:
        with warnings.catch_warnings(), native_stderr_captured():
            warnings.simplefilter("ignore")
            import tensorflow as tf
    _quiet_loggers(tf)
    _MODULE = tf
    return tf


def _quiet_loggers(tf: ModuleType) -> None:
    """TensorFlow's and absl's Python loggers at ERROR: retracing and AutoGraph warnings are not the user's."""
    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # absl ships with TensorFlow; tolerate its absence
        pass


def configure() -> None:
    """Nothing to set before import: logical CPUs are made at discovery, before the runtime starts."""
    quiet_environment()


def before_keras() -> None:
    """Import TensorFlow quietly before Keras does (Keras would import it with its logs on)."""
    tensorflow()


def versions() -> dict[str, str]:
    """Versions of what measured (TensorFlow from the module: it ships as several distributions)."""
    tf = tensorflow()
    found = package_versions()
    found["tensorflow"] = tf.__version__
    build = tf.sysconfig.get_build_info()
    if build.get("cuda_version"):
        found["cuda"] = str(build["cuda_version"])
        found["cudnn"] = str(build.get("cudnn_version"))
    return found


def settings(xla: bool) -> dict[str, Any]:
    """CPU threading, oneDNN and XLA choices: they change timings, so they travel with them."""
    tf = tensorflow()
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return dict(
        common_settings(),
        intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads() or "default (all cores)",
        inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads() or "default",
        onednn="off" if onednn == "0" else ("on" if onednn == "1" else "default (on for x86 builds)"),
        xla_jit_compile=bool(xla),
        tf_xla_flags=os.environ.get("TF_XLA_FLAGS"),
        grappler="default",
    )

