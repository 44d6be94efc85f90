"""What each device can still hold, and the two decisions the profiler makes from it between groups.

A capture whose activations would not fit in the host's memory is refused before it runs (the OS
would kill the process), and a finished group's programs are collected only where what they hold
matters: a full collection takes about 0.2 s once TensorFlow is loaded, more than a small model's
whole group.
"""

from __future__ import annotations

import gc

from tbs.backends.base import Device
from tbs.backends.host import memory_headroom_bytes

RELEASE_SHARE = 0.01  # collect between groups whose programs hold this share of what the device can hold


def memory_limit_bytes(device: Device) -> float | None:
    """What a device can hold: the host's headroom for a CPU, the allocator's limit for an accelerator."""
    return memory_headroom_bytes() if device.kind == "cpu" else device.memory_bytes


def host_shortfall(device: Device, activation_bytes_per_sample: float, batch: int) -> str | None:
    """Why a capture on the host cannot run (its activations need 80% of the headroom or more), else None."""
    if device.kind != "cpu" or not activation_bytes_per_sample:
        return None
    need = activation_bytes_per_sample * batch
    free = memory_headroom_bytes()
    if free is None or need < 0.8 * free:
        return None
    return (f"out of memory: batch {batch} needs about {need / 2**30:.1f} GiB of activations, "
            f"{free / 2**30:.1f} GiB is available")


def release(device: Device, held_bytes: float) -> None:
    """Free a finished group's programs (reference cycles) where they hold 1% of what ``device`` can
    still hold (its activations, a training step's residuals), or where that is not known."""
    limit_bytes = memory_limit_bytes(device)
    if not limit_bytes or held_bytes >= RELEASE_SHARE * limit_bytes:
        gc.collect()
