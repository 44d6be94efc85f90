"""What XLA says a call costs on a JAX device, and the programs that calibrate the device's ceilings.

The analysed program is the call alone, as a pure function of its variables' values and its
tensors (the body the timed loop repeats): ``jit(...).lower()`` gives the HLO before XLA's
passes, ``.compile()`` the optimised program, its cost analysis and its memory analysis.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tbs.backends import xla
from tbs.backends.base import (CALIBRATION_MATMUL_N, CALIBRATION_STREAM_BYTES, CalibrationProgram,
                               ProgramCost)
from tbs.backends.jax.environment import jax as _jax


def program_cost(place: Callable[[Any], Any], pure: Callable[..., Any], values: list[Any],
                 tensors: list[Any]) -> ProgramCost:
    """XLA's analysis of ``pure(values, *tensors)``, lowered and compiled for the device ``place`` targets."""
    return lowered_cost(pure, [place(v) for v in values], *[place(t) for t in tensors])


def lowered_cost(fn: Callable[..., Any], *args: Any) -> ProgramCost:
    """XLA's analysis of ``jit(fn)(*args)``: before optimisation, after it, and the compiled memory.

    The program is never run: on a CPU its machine code is generated at xla.ANALYSIS_LLVM_LEVEL (the
    counts and memory come from the HLO passes and buffer assignment before it; tests/test_analysis.py
    pins that). An accelerator's compile keeps XLA's defaults: nothing here has checked that its
    passes ignore the level.
    """
    lowered = _jax().jit(fn).lower(*args)
    before = xla.cost_fields(lowered.cost_analysis())
    options = ({"xla_backend_optimization_level": xla.ANALYSIS_LLVM_LEVEL,
                "xla_disable_hlo_passes": xla.ANALYSIS_DISABLED_PASSES} if _on_cpu(args) else None)
    compiled = lowered.compile(compiler_options=options)
    after = dict(xla.cost_fields(compiled.cost_analysis()), kernels=xla.kernels_of(compiled.as_text()))
    memory = xla.memory_fields(compiled.memory_analysis())
    return xla.program_cost("xla", before, after, memory)


def _on_cpu(args: tuple) -> bool:
    """Whether the program runs on a CPU: where its arrays are, else where JAX puts uncommitted ones."""
    jax = _jax()
    platforms = {device.platform for leaf in jax.tree_util.tree_leaves(args) if hasattr(leaf, "devices")
                 for device in leaf.devices()}
    return (platforms or {jax.default_backend()}) == {"cpu"}


def calibration_programs(kind: str, place: Callable[[Any], Any],
                         compile_blocked: Callable[..., Any], dtype: str) -> list[CalibrationProgram]:
    """A matmul (its FLOP/s) and a sum over a large array (its read bandwidth) in ``dtype``."""
    jnp = _jax().numpy
    n = CALIBRATION_MATMUL_N.get(kind, CALIBRATION_MATMUL_N["cpu"])
    rng = np.random.default_rng(0)
    a = place(jnp.asarray(rng.standard_normal((n, n), np.float32), dtype))
    b = place(jnp.asarray(rng.standard_normal((n, n), np.float32), dtype))
    itemsize = np.dtype(jnp.dtype(dtype)).itemsize
    count = CALIBRATION_STREAM_BYTES.get(kind, CALIBRATION_STREAM_BYTES["cpu"]) // itemsize
    x = place(jnp.ones((count,), dtype))
    return [
        CalibrationProgram("matmul", dtype, compile_blocked(lambda p, q: p @ q, [a, b], True), 2.0 * n ** 3,
                           3.0 * n * n * itemsize),
        CalibrationProgram("stream", dtype, compile_blocked(lambda v: jnp.sum(v, dtype=jnp.float32), [x], True),
                           float(count), float(count * itemsize)),
    ]
