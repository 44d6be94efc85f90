"""TensorFlow devices: discovery (CPU, GPUs, TPU with a timeout) and blocked, compiled calls.

A timed call runs the layer n times inside one ``tf.function`` holding a
``tf.while_loop`` (parallel_iterations=1, so iterations never overlap). Unrolled
copies of the same call would be merged by Grappler; a loop body really runs
every iteration. Each iteration consumes one element of every output, so
nothing is pruned, and the runner waits on one scalar instead of copying
activations back to the host.
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Sequence

from tbs.devices import Device, Discovery
from tbs.sysinfo import cpu_model, total_memory_bytes
from tbs.tfenv import native_stderr_captured
from tbs.tfenv import tensorflow as _tensorflow

TPU_DISCOVERY_TIMEOUT_S = 10.0


def _consume(structure: Any) -> Any:
    """A float32 scalar depending on one element of every output tensor (cheap, un-prunable)."""
    tf = _tensorflow()
    total = tf.constant(0.0)
    for part in tf.nest.flatten(structure, expand_composites=True):
        if not isinstance(part, tf.Tensor):
            continue
        head = tf.reshape(part, [-1])[:1]
        if part.dtype == tf.string:
            head = tf.strings.length(head)
        elif part.dtype.is_complex:
            head = tf.math.real(head)
        total += tf.reduce_sum(tf.cast(head, tf.float32))
    return total


class TFDevice(Device):
    """A TensorFlow logical device (/device:CPU:0, /device:GPU:1, /device:TPU:0)."""

    backend = "tensorflow"

    def __init__(self, kind: str, index: int, tf_name: str, description: str = "",
                 memory_bytes: int | None = None) -> None:
        self.kind = kind
        self.index = index
        self.name = f"{kind}:{index}"
        self.tf_name = tf_name
        self.description = description
        self.memory_bytes = memory_bytes

    def __repr__(self) -> str:
        return f"TFDevice({self.name}, {self.tf_name})"

    def scope(self) -> AbstractContextManager:
        return _tensorflow().device(self.tf_name)

    def place(self, structure: Any) -> Any:
        tf = _tensorflow()

        def copy(x: Any) -> Any:
            if not (isinstance(x, (tf.Tensor, tf.Variable)) or (hasattr(x, "shape") and hasattr(x, "dtype"))):
                return x
            is_string = getattr(x, "dtype", None) == tf.string or getattr(getattr(x, "dtype", None), "kind", "") in "OSU"
            # Strings have no device memory on accelerators: they stay on the host, and the
            # string ops that read them run there (reported as cpu-fallback).
            with tf.device("/device:CPU:0") if is_string else self.scope():
                return tf.identity(x) if isinstance(x, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(x)

        return tf.nest.map_structure(copy, structure)

    def compile_blocked(self, call: Callable[..., Any], tensors: list[Any], jit: bool,
                        variables: Sequence[Any] = ()) -> Callable[[int], None]:
        """``variables`` are read inside the loop as the resource variables they are."""
        tf = _tensorflow()
        device_name = self.tf_name
        # With XLA, the call is its own XLA computation launched every iteration; compiling
        # the loop too would let XLA hoist the loop-invariant call out of it.
        step = tf.function(call, jit_compile=True) if jit else call

        @tf.function(jit_compile=False)
        def blocked(n: Any, *args: Any) -> Any:
            def body(i: Any, acc: Any) -> tuple[Any, Any]:
                with tf.device(device_name):
                    out = step(*args)
                    return i + 1, acc + _consume(out)

            return tf.while_loop(
                lambda i, acc: i < n, body, (tf.constant(0), tf.constant(0.0)), parallel_iterations=1
            )[1]

        def runner(n: int) -> None:
            result = blocked(tf.constant(n, dtype=tf.int32), *tensors)
            self.sync()
            result.numpy()  # a 4-byte scalar: waits for the device without copying activations

        return runner

    def run_placed(self, call: Any, args: tuple, kwargs: dict) -> Any:
        with _tensorflow().device(self.tf_name):
            return call.invoke(*args, **kwargs)

    def replay_runner(self, replay: Callable[..., Any], tensors: list[Any]) -> Callable[[int], None]:
        # One graph: tf.device scopes inside it put each call where it was placed.
        return self.compile_blocked(replay, tensors, False)

    def ran_here(self, call: Any) -> bool:
        """Every op of the call (seen in the eager capture here) produced its output on this device."""
        want = self.tf_name.upper().split("DEVICE:")[-1]  # e.g. CPU:1
        seen = [d.upper() for devices in call.op_devices.values() for d in devices if d]
        return all(d.endswith(want) for d in seen)

    def sync(self) -> None:
        if self.kind != "cpu":
            _tensorflow().test.experimental.sync_devices()


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
    """
    tf = _tensorflow()
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
    if logical_cpus.isdigit() and int(logical_cpus) > 1:
        split_host_cpu(int(logical_cpus))
    with native_stderr_captured():  # the runtime starts here: CUDA probing logs on GPU-less hosts
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
