"""TensorFlow during the eager capture: which device each eager op really ran on.

TensorFlow silently runs an op on the host CPU when the target device has no
kernel for it (string ops on a GPU); an op callback sees each eager op's output
device, so a "GPU" number that ran on the CPU can say so.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


class _OpDeviceRecorder:
    """Collects, per op type, the devices that eager ops' outputs landed on."""

    def __init__(self) -> None:
        self.devices: dict[str, set[str]] = {}

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if isinstance(op_type, bytes):
            op_type = op_type.decode(errors="replace")
        if graph is None:
            for out in outputs or ():
                device = getattr(out, "device", "") or ""
                self.devices.setdefault(op_type, set()).add(device)
        return None


def _op_callbacks() -> Any:
    try:
        from tensorflow.python.framework import op_callbacks  # internal but stable since TF 2.2

        return op_callbacks
    except ImportError:  # pragma: no cover - depends on TF internals
        return None


@contextmanager
def watch_ops() -> Iterator[dict[str, set[str]]]:
    """Record, per op type, the devices that eager ops' outputs landed on inside the block."""
    recorder = _OpDeviceRecorder()
    callbacks = _op_callbacks()
    if callbacks is not None:
        callbacks.add_op_callback(recorder)
    try:
        yield recorder.devices
    finally:
        if callbacks is not None:
            callbacks.remove_op_callback(recorder)
