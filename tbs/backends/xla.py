"""XLA's own cost and memory analysis, for any backend that hands XLA a program.

JAX exposes it on every lowered and compiled program. TensorFlow exposes the HLO it
gives XLA (``experimental_get_compiler_ir``) but no analysis of it, so its HLO text is
parsed and analysed by the same XLA (jaxlib's ``HloCostAnalysis``): the FLOPs and bytes
of the program TensorFlow compiles, counted by the compiler's own rules, not by ours.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tbs.backends import hlo_kernels
from tbs.backends.base import ProgramCost


def cost_fields(analysis: Any) -> dict[str, float | None]:
    """flops / bytes accessed / transcendentals from an XLA cost-analysis dict (or a one-element list of one)."""
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    if not isinstance(analysis, Mapping):
        return {"flops": None, "bytes_accessed": None, "transcendentals": None}

    def value(key: str) -> float | None:
        raw = analysis.get(key, 0.0)  # XLA leaves out a count that is zero (a copy has no "flops")
        return float(raw) if raw is not None and float(raw) >= 0 else None

    return {"flops": value("flops"), "bytes_accessed": value("bytes accessed"),
            "transcendentals": value("transcendentals")}


def memory_fields(stats: Any) -> dict[str, int | None]:
    """Temporary, argument and output bytes from XLA's CompiledMemoryStats (None where absent)."""
    def value(name: str) -> int | None:
        raw = getattr(stats, name, None)
        return int(raw) if raw is not None and raw >= 0 else None

    return {"temp_bytes": value("temp_size_in_bytes"), "argument_bytes": value("argument_size_in_bytes"),
            "output_bytes": value("output_size_in_bytes")}


def hlo_text_cost(hlo_text: str) -> dict[str, float | None]:
    """XLA's HloCostAnalysis of an HLO module given as text (TensorFlow's compiler IR)."""
    import jax
    from jax._src.lib import xla_client
    from jaxlib import _hlo

    module = _hlo.hlo_module_from_text(hlo_text)
    client = jax.devices("cpu")[0].client
    return cost_fields(xla_client._xla.hlo_module_cost_analysis(client, module))


# LLVM's optimisation level for the analysis compile. The counts and the memory come from the HLO
# passes and buffer assignment, which run before code generation: on the 423 programs of an
# InceptionV3 profile and an EfficientNetB0 training profile both are identical at 0 and at XLA's
# default, and the compile takes 0.63x the time (EfficientNetB0 training at batch 4: 37.5 -> 23.5 s).
ANALYSIS_LLVM_LEVEL = 0
# The analysis compile keeps half-precision dots and convolutions in half precision. A CPU has no FP16 or BF16
# GEMM, so XLA's CPU pipeline (its ``change-op-data-type`` pass) rewrites each one as an FP32 GEMM between
# converts: an FP32 copy of every operand, an FP32 result converted back. A GPU runs the half-precision GEMM on
# its inputs as they are, so those copies are kernels it never launches and the GEMM moves half the bytes
# (BERT-base's forward at 128 tokens: 1.71 GB of kernel traffic with the pass, 1.14 GB without; FP32 programs
# are unchanged). The program is never run, so it does not matter that the CPU could not run it fast. BFLOAT16 is
# left as the CPU compiles it (its BF16 normalisation cannot be left out: the CPU cannot emit a BF16 convolution).
ANALYSIS_DISABLED_PASSES = "change-op-data-type"


def hlo_compiled(serialized_hlo: bytes, llvm_level: int | None = ANALYSIS_LLVM_LEVEL,
                 rename: Callable[[str], str] | None = None
                 ) -> tuple[dict[str, float | None], dict[str, Any], dict[str, int | None]]:
    """XLA's cost analysis of a serialized HloModuleProto as given and of its optimised program (with its
    ``kernels``), and the memory analysis, from one compile for this host's CPU.

    TensorFlow keeps its compiled XLA executables to itself; compiling the same HLO with the
    same compiler gives the optimised program (its counts match TensorFlow's own optimised
    HLO) and the buffer sizes it needs: CPU figures, so only for a CPU device. The program is never
    run, so its machine code is generated at ``llvm_level`` (None: XLA's default). ``rename`` maps each
    kernel's framework op name to the Keras call that made it (see ``kernels_of``).
    """
    import jax
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir
    from jaxlib import _hlo

    computation = _hlo.XlaComputation(serialized_hlo)
    client = jax.devices("cpu")[0].client
    before = cost_fields(xla_client._xla.hlo_module_cost_analysis(client, computation.get_hlo_module()))
    text = xla_client._xla.mlir.xla_computation_to_mlir_module(computation)
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1, env_options_overrides={
            "xla_disable_hlo_passes": ANALYSIS_DISABLED_PASSES})
        if llvm_level is not None:
            options.executable_build_options.debug_options.xla_backend_optimization_level = llvm_level
        devices = xla_client.DeviceList(tuple(client.devices()[:1]))
        executable = compiler.backend_compile_and_load(client, module, devices, options, [])
    optimised = executable.hlo_modules()[0]
    after = dict(cost_fields(xla_client._xla.hlo_module_cost_analysis(client, optimised)),
                 kernels=kernels_of(optimised.to_string(), rename))
    return before, after, memory_fields(executable.get_compiled_memory_stats())


def kernels_of(optimised_hlo_text: str, rename: Callable[[str], str] | None = None) -> str | None:
    """The optimised program's kernels as JSON (None where its HLO cannot be read: the counts still stand).

    ``rename`` gives each kernel's op name its Keras call path: TensorFlow makes a traced function's name scopes
    unique (a model called before has ``conv2d_1/`` for its layer ``conv2d``, and ``conv2d_1_2/`` for ``conv2d_1``),
    so an op's scope alone can name the wrong layer.
    """
    try:
        kernels = hlo_kernels.program_kernels(optimised_hlo_text)
    except (ValueError, IndexError, KeyError):
        return None
    if rename is not None:
        kernels = [dict(k, op=rename(str(k["op"]))) if k.get("op") else k for k in kernels]
    return hlo_kernels.dumps(kernels)


def program_cost(source: str, before: Mapping[str, Any], after: Mapping[str, Any],
                 memory: Mapping[str, Any] | None, reason: str = "") -> ProgramCost:
    """One ProgramCost from the analyses before and after optimisation, and the memory analysis."""
    return ProgramCost(
        source=source, flops=after.get("flops"), bytes_accessed=after.get("bytes_accessed"),
        flops_unoptimized=before.get("flops"), bytes_unoptimized=before.get("bytes_accessed"),
        transcendentals=after.get("transcendentals"), reason=reason, kernels=after.get("kernels"),
        **dict(memory or {}))
