"""The whole-model programs XLA's GPU compiler makes for the published GPUs, compiled on this CPU-only machine.

XLA can compile for a GPU it does not have ("deviceless" ahead-of-time compilation): given the GPU's description
(compute capability, SMs, memory bandwidth, caches), JAX's CUDA plugin runs XLA:GPU's whole pipeline (its fusion,
its cuBLAS and cuDNN rewrites, its layouts) without a device. The optimised program is then the one that GPU
would run, not the CPU's program with a GPU's fusions guessed (benchmarks/whole_models.py, what `tbs predict`
reads from a profile). Here each rebuild of whole_models.py (Keras on JAX) is compiled for the GPU of each
published row, at the row's batch and precision; whole_model.py and whole_training.py price those
programs in a section of their own once they are compiled.

Compiling needs JAX's CUDA plugin (about 5.5 GB of NVIDIA libraries), which tbs does not install; keep it out of
tbs's own environment (its plugin would try to start CUDA in every test):

    python3 -m venv /tmp/gpu-compile && /tmp/gpu-compile/bin/pip install "jax[cuda12]==$(python -c 'import jax;
        print(jax.__version__)')" keras pandas plotly click cloudpickle pyyaml   # tbs's own, without TensorFlow
    /tmp/gpu-compile/bin/python benchmarks/gpu_programs.py     # every inference configuration, ~20 min on 2 cores

Reading the compiled programs back (``gpu_kernels``) needs only tbs (tbs.backends.hlo_kernels).
GEMMs stay on cuBLAS, as XLA's GPU backend ran them in the TensorFlow containers of the published tables (20.06 to
21.02), and nothing is rematerialised (``FLAGS``); without a device nothing is autotuned.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TBS_GPU_PROGRAMS", "/tmp/tbs_gpu_programs"))
# GEMMs on cuBLAS (as the published TensorFlow containers' XLA ran them); and no rematerialisation: a program
# planned over the described GPU's memory is recomputed in part to fit it, where each published run fitted its
# GPU as TensorFlow planned it (BERT-large's FP16 train step at batch 24, planned at 21.2 GiB, was otherwise
# recomputed down to 16.2 GiB for a 16 GB V100).
FLAGS = "--xla_gpu_enable_triton_gemm=false --xla_gpu_memory_limit_slop_factor=100000"

# Each published GPU as XLA:GPU's compiler sees it (NVIDIA's datasheets and the CUDA programming guide's
# per-compute-capability limits): compute capability, SMs, FP32 lanes per SM, memory bandwidth (bytes/s), L2
# (bytes), boost clock (GHz), memory (bytes), shared memory per SM and the most one block may opt into (bytes),
# resident threads per SM.
TARGETS = {
    "v100": ((7, 0), 80, 64, 900e9, 6 << 20, 1.53, 16 << 30, 96 << 10, 96 << 10, 2048, "Tesla V100-SXM2-16GB"),
    "t4": ((7, 5), 40, 64, 320e9, 4 << 20, 1.59, 15 << 30, 64 << 10, 64 << 10, 1024, "Tesla T4"),
    "a100-40gb": ((8, 0), 108, 64, 1555e9, 40 << 20, 1.41, 40 << 30, 164 << 10, 163 << 10, 2048,
                  "NVIDIA A100-SXM4-40GB"),
    "a100-80gb": ((8, 0), 108, 64, 2039e9, 40 << 20, 1.41, 80 << 30, 164 << 10, 163 << 10, 2048,
                  "NVIDIA A100-SXM4-80GB"),
    "h100": ((9, 0), 132, 128, 3352e9, 50 << 20, 1.98, 80 << 30, 228 << 10, 227 << 10, 2048, "NVIDIA H100 80GB HBM3"),
    "h200": ((9, 0), 132, 128, 4800e9, 50 << 20, 1.98, 141 << 30, 228 << 10, 227 << 10, 2048, "NVIDIA H200"),
}


def target_config(gpu: str) -> str:
    """XLA's GpuTargetConfig (text proto) for ``gpu``: what a deviceless compile optimises for."""
    (major, minor), sms, lanes, bandwidth, l2, clock, memory, shared, optin, threads, name = TARGETS[gpu]
    info = {"threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 << 10,
            "shared_memory_per_core": shared, "threads_per_core_limit": threads, "core_count": sms,
            "fpus_per_core": lanes, "block_dim_limit_x": 2**31 - 1, "block_dim_limit_y": 65535,
            "block_dim_limit_z": 65535, "memory_bandwidth": int(bandwidth), "l2_cache_size": l2,
            "clock_rate_ghz": clock, "device_memory_size": memory, "shared_memory_per_block_optin": optin,
            "registers_per_core_limit": 65536, "registers_per_block_limit": 65536}
    fields = "".join(f"  {key}: {value}\n" for key, value in info.items())
    return (f"gpu_device_info {{\n{fields}  cuda_compute_capability {{\n    major: {major}\n    minor: {minor}\n  }}\n}}\n"
            f'platform_name: "CUDA"\ndnn_version_info {{\n  major: 9\n  minor: 8\n}}\n'
            f'runtime_version {{\n  major: 12\n  minor: 8\n}}\ndevice_description_str: "{name}"\n')


def program_path(gpu: str, model: str, sequence: int | None, batch: int, half: bool, training: bool = False) -> Path:
    """Where the optimised HLO of one configuration's forward (or train step) for ``gpu`` is kept, gzipped."""
    step = "train-" if training else ""
    return CACHE / f"{step}{gpu}-{model}-{sequence or 0}-{batch}-{'fp16' if half else 'fp32'}.hlo.gz"


_READ: dict[Path, list[dict]] = {}


def gpu_kernels(gpu: str, model: str, sequence: int | None, batch: int, half: bool,
                training: bool = False) -> list[dict]:
    """The kernels (tbs.backends.hlo_kernels) of the program compiled for ``gpu``; FileNotFoundError, naming the
    command that compiles it, where it is not compiled yet."""
    from tbs.backends import hlo_kernels

    path = program_path(gpu, model, sequence, batch, half, training)
    if path not in _READ:
        if not path.exists():
            raise FileNotFoundError(f"{path} is not compiled: run benchmarks/gpu_programs.py in an environment "
                                    "with JAX's CUDA plugin (see its docstring)")
        _READ[path] = hlo_kernels.program_kernels(gzip.decompress(path.read_bytes()).decode())
    return [dict(k) for k in _READ[path]]


def _abstract(sharding, value):
    """A variable's shape and type on the described GPU: a program is compiled for it, never run."""
    import jax

    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)


def _sharding(gpu: str):
    """One device of ``gpu`` (a topology described, not found): where every argument of a program lives."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    topology = topologies.get_topology_desc(platform="cuda", target_config=target_config(gpu), topology="1x1x1")
    return NamedSharding(topologies.make_mesh(topology, (1,), ("device",)), PartitionSpec())


def compile_forward(gpu: str, model: str, sequence: int | None, batch: int, half: bool) -> str:
    """The optimised HLO of the rebuild's inference forward, compiled for ``gpu`` without one."""
    import jax
    import jax.numpy as jnp
    import keras

    sharding = _sharding(gpu)
    keras.mixed_precision.set_global_policy("mixed_float16" if half else "float32")
    try:
        network = _network(model, sequence)
        trainable = [_abstract(sharding, v.value) for v in network.trainable_variables]
        fixed = [_abstract(sharding, v.value) for v in network.non_trainable_variables]
        dtype = jnp.int32 if "int" in str(network.inputs[0].dtype) else jnp.float32
        inputs = jax.ShapeDtypeStruct((batch, *network.inputs[0].shape[1:]), dtype, sharding=sharding)

        def forward(trainable, fixed, inputs):
            return network.stateless_call(trainable, fixed, inputs, training=False)[0]

        return jax.jit(forward).lower(trainable, fixed, inputs).compile().as_text()
    finally:
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()


def compile_train_step(gpu: str, model: str, sequence: int | None, batch: int, half: bool) -> str:
    """The optimised HLO of one train step of the rebuild, compiled for ``gpu`` without one: the forward with
    training=True (BERT's dropout on), the published loss, every trainable variable's gradient and the published
    optimizer's update (whole_train_steps.optimizer_of), one program, as tbs's TensorFlow train step compiles it for a
    CPU (whole_train_steps.compiled_train_kernels), here at the published batch itself."""
    import jax
    import keras

    import whole_models
    import whole_train_steps

    sharding = _sharding(gpu)
    keras.mixed_precision.set_global_policy("mixed_float16" if half else "float32")
    try:
        network = whole_models.build(model, sequence, training=True)
        loss = whole_train_steps.train_loss(model, network)
        optimizer = whole_train_steps.optimizer_of(model, loss_scale=False)
        optimizer.build(network.trainable_variables)
        inputs, targets = ([jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in group]
                           for group in whole_train_steps.train_shapes(model, network, batch))
        state = [[_abstract(sharding, v.value) for v in variables] for variables in
                 (network.trainable_variables, network.non_trainable_variables, optimizer.variables)]

        def step(trainable, fixed, slots, inputs, targets):
            def value(trainable):
                outputs, fixed_after = network.stateless_call(trainable, fixed, inputs[0], training=True)
                return loss(targets, outputs), fixed_after
            gradients, fixed_after = jax.grad(value, has_aux=True)(trainable)
            trainable_after, slots_after = optimizer.stateless_apply(slots, gradients, trainable)
            return trainable_after, fixed_after, slots_after

        return jax.jit(step, donate_argnums=(0, 1, 2)).lower(*state, inputs, targets).compile().as_text()
    finally:
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()


# Compiled to check the deviceless compile against a GPU's own: ResNet-50 and models/build.py's BERT-base-sized
# encoder as the H200 machine compiled them for profiles/h200/*/inference (their model rows keep the programs'
# kernels).
H200_CHECKS = [("h200", "resnet50", None, batch, False) for batch in (1, 32, 256)] + [
    ("h200", "bert_encoder", 128, 32, False)]


def _network(model: str, sequence: int | None):
    """The Keras model compiled for a configuration: a whole_models.py rebuild, or the example encoder the H200
    machine profiled (models/build.py's, which builds on JAX where TensorFlow is absent)."""
    if model != "bert_encoder":
        import whole_models

        return whole_models.build(model, sequence)
    sys.path.insert(0, str(HERE.parent / "models"))
    import build

    return build.bert_base()


def configurations(training: bool = False) -> list[tuple[str, str, int | None, int, bool]]:
    """Every (GPU, model, sequence, batch, half) of whole_models.csv's rows at batch <= 32, or with ``training`` of
    whole_training.csv's (TF32 rows share their FP32 program: the precision a GEMM runs at is the pricing's, not
    the program's)."""
    import pandas as pd

    table = pd.read_csv(HERE.parent / f"tbs/predictions/reference/whole_{'training' if training else 'models'}.csv")
    table = table if training else table[table["batch_size"] <= 32]
    found = set()
    for row in table.itertuples():
        sequence = int(row.sequence_length) if row.sequence_length == row.sequence_length else None
        found.add((row.device, row.model, sequence, int(row.batch_size), row.precision == "fp16"))
    return sorted(found, key=lambda c: (c[1], c[2] or 0, c[4], c[0], c[3])) + ([] if training else H200_CHECKS)


def main() -> None:
    """Compile every configuration not in the cache yet (``TBS_GPU_PROGRAMS``): the inference forwards, and with
    --train the train steps; model names as arguments narrow it."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ["JAX_PLATFORMS"] = "cpu"  # the host runs Keras; the plugin compiles for the described GPU
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # its check starts CUDA, which needs a device
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FLAGS}".strip()
    sys.path.insert(0, str(HERE))
    training = "--train" in sys.argv[1:]
    only = {a for a in sys.argv[1:] if not a.startswith("--")}
    CACHE.mkdir(parents=True, exist_ok=True)
    for gpu, model, sequence, batch, half in configurations(training):
        path = program_path(gpu, model, sequence, batch, half, training)
        if path.exists() or (only and model not in only):
            continue
        start = time.time()
        text = (compile_train_step if training else compile_forward)(gpu, model, sequence, batch, half)
        path.write_bytes(gzip.compress(text.encode()))
        print(f"{path.name}: {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
