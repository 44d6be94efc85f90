"""TensorFlow's devices on this host: CPU (split into logical CPUs on request), GPUs, a TPU with a timeout."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

from tbs.backends.base import Device, Discovery
from tbs.backends.host import cpu_model, native_stderr_captured, total_memory_bytes
from tbs.backends.tensorflow.device import TFDevice
from tbs.backends.tensorflow.environment import tensorflow as _tensorflow

TPU_DISCOVERY_TIMEOUT_S = 10.0


def _gpu_missing_reason() -> str:
    tf = _tensorflow()
    if not tf.test.is_built_with_cuda() and not tf.test.is_built_with_rocm():
        return "no GPU: this TensorFlow build has no CUDA/ROCm support (e.g. tensorflow-cpu)"
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        return "no GPU visible: no NVIDIA driver found (nvidia-smi missing)"
    return "no GPU visible to TensorFlow (check CUDA_VISIBLE_DEVICES and the CUDA libraries)"


def _tpu_hints() -> list[str]:
    hints = [v for v in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE") if os.environ.get(v)]
    hints += [str(p) for p in Path("/dev").glob("accel*")]
    if Path("/dev/vfio").exists() and any(Path("/dev/vfio").iterdir()):
        hints.append("/dev/vfio")
    return hints


def _discover_tpus(timeout_s: float) -> tuple[list[TFDevice], str | None]:
    if not _tpu_hints():
        return [], "no TPU system reachable (TPU_NAME not set, no /dev/accel* device)"
    tf = _tensorflow()
    found: dict[str, Any] = {}

    def connect() -> None:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            found["devices"] = tf.config.list_logical_devices("TPU")
        except Exception as exc:  # any failure is a reason, not a crash
            found["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return [], f"TPU discovery timed out after {timeout_s:.0f} s (no TPU system answered)"
    if "error" in found:
        return [], f"TPU system not usable: {found['error']}"
    devices = [TFDevice("tpu", i, d.name, description="TPU core") for i, d in enumerate(found.get("devices", []))]
    return devices, None if devices else "TPU system reached but it has no TPU cores"


def split_host_cpu(count: int) -> bool:
    """Expose the host CPU as ``count`` logical devices (multi-device paths without accelerators).

    Only possible before TensorFlow's runtime starts; returns whether it took effect.
    Listing the physical devices probes CUDA, which logs natively on GPU-less hosts: held back too.
    """
    tf = _tensorflow()
    with native_stderr_captured():
        cpus = tf.config.list_physical_devices("CPU")
        try:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
        except (RuntimeError, ValueError):
            return False
    return True


def discover(tpu_timeout_s: float = TPU_DISCOVERY_TIMEOUT_S) -> Discovery:
    """Every TensorFlow device on this host, plus why each missing kind is missing.

    ``TBS_LOGICAL_CPUS=N`` splits the host CPU into N logical devices first.
    """
    tf = _tensorflow()
    logical_cpus = os.environ.get("TBS_LOGICAL_CPUS", "")
    # the first device query probes CUDA (a native 'failed call to cuInit' line on GPU-less hosts),
    # whether it is the split's or discovery's: both run with fd 2 held back, replayed on failure
    with native_stderr_captured():
        if logical_cpus.isdigit() and int(logical_cpus) > 1:
            split_host_cpu(int(logical_cpus))
        return _discover(tf, tpu_timeout_s)


def _discover(tf: Any, tpu_timeout_s: float) -> Discovery:
    devices: list[Device] = []
    missing: dict[str, str] = {}
    cpu_name = cpu_model()
    cores = os.cpu_count() or 0
    for i, logical in enumerate(tf.config.list_logical_devices("CPU")):
        devices.append(TFDevice("cpu", i, logical.name, f"{cpu_name} ({cores} cores)", total_memory_bytes()))
    gpus = tf.config.list_logical_devices("GPU")
    physical = tf.config.list_physical_devices("GPU")
    for i, logical in enumerate(gpus):
        description = "GPU"
        if i < len(physical):
            details = tf.config.experimental.get_device_details(physical[i])
            description = details.get("device_name", "GPU")
            if details.get("compute_capability"):
                description += " (compute {}.{})".format(*details["compute_capability"])
        devices.append(TFDevice("gpu", i, logical.name, description))
    if not gpus:
        missing["gpu"] = _gpu_missing_reason()
    tpus, reason = _discover_tpus(tpu_timeout_s)
    devices.extend(tpus)
    if reason:
        missing["tpu"] = reason
    return Discovery(devices=devices, missing=missing)
