"""Import TensorFlow quietly, once (Keras itself is imported by ``tbs.backend``).

TensorFlow prints C++ log lines at import; a user's terminal should show only
tbs's own output and one-line errors. Imports are lazy so that argument errors
are reported before the (slow) TensorFlow import.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator


def quiet_environment() -> None:
    """Environment variables that must be set before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "2")


@contextmanager
def native_stderr_captured() -> Iterator[None]:
    """Hold back what native code writes to fd 2 (absl's pre-init log lines, CUDA probing); replay it on failure."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (e.g. some test runners)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))


def tensorflow() -> ModuleType:
    """The tensorflow module, imported with its logs silenced."""
    quiet_environment()
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf
    with warnings.catch_warnings(), native_stderr_captured():
        warnings.simplefilter("ignore")
        import tensorflow as tf
    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # absl ships with TensorFlow; tolerate its absence
        pass
    return tf
