"""A few whole-model calls traced with ``jax.profiler``, each XLA kernel with the Keras layers whose work it runs.

On XLA:CPU the trace names every thunk it runs by its HLO instruction (``tbs.backends.xla_trace``
reads them and when each really ends). The first call traced is the profiler's warm-up (its thread-pool
listener starts: 5-10x a warm call's span here) and is left out. The optimised HLO of the same compiled program maps
each instruction to the framework ops it runs (``hlo_kernels.instruction_parts``): their
``op_name``s carry the Keras layer path (``jit(forward)/model/block/conv/conv_general_dilated``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tbs.backends.base import TracedCalls, TracedOp
from tbs.backends import xla_trace
from tbs.backends.hlo_kernels import instruction_parts

TOOL = "jax.profiler (XLA kernels)"


def _events(path: Path) -> list[tuple[str, float, float, dict[str, Any]]]:
    """Every event of every plane in an XSpace file: (name, start_ns, duration_ns, stats)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(path))
    return [(e.name, float(e.start_ns), float(e.duration_ns), dict(e.stats))
            for plane in data.planes for line in plane.lines for e in line.events]


def ops_of(events: list[tuple[str, float, float, dict[str, Any]]], module: str,
           parts: dict[str, list[tuple[str, float]]], calls: int | None = None) -> TracedCalls:
    """The kernels of ``module``'s runs (one per traced call, the first, the profiler's warm-up, left out),
    times in seconds from the first kept kernel. ``calls``: how many calls were traced, the warm-up included
    (what splits a GPU's kernels, which carry no run id, into runs)."""
    ordered = xla_trace.kernels(events, module=module, calls=calls)[1:]
    origin = min((s for ops in ordered for _, s, _ in ops), default=0.0)
    calls, traced = [], []
    for index, ops in enumerate(ordered):
        first, last = min(s for _, s, _ in ops), max(e for _, _, e in ops)
        calls.append(((first - origin) / 1e9, (last - first) / 1e9))
        traced += [TracedOp(index, name, (start - origin) / 1e9, (end - start) / 1e9, list(parts.get(name, [])))
                   for name, start, end in ops]
    return TracedCalls(calls, traced, TOOL)


def trace_calls(jitted: Any, arguments: tuple, calls: int) -> TracedCalls | None:
    """``calls`` calls of a ``jax.jit`` function's compiled program traced (one warm call
    first), with its optimised HLO's parts: one compile, whose HLO is the program traced."""
    import jax

    compiled = jitted.lower(*arguments).compile()
    module = compiled.as_text()
    name = _module_name(module)
    jax.block_until_ready(compiled(*arguments))  # warm: its first call allocates and loads the executable
    with tempfile.TemporaryDirectory(prefix="tbs-trace-") as directory:
        jax.profiler.start_trace(directory)
        try:
            for _ in range(calls + 1):  # the first is the profiler's warm-up (left out)
                jax.block_until_ready(compiled(*arguments))
        finally:
            jax.profiler.stop_trace()
        found = sorted(Path(directory).rglob("*.xplane.pb"))
        if not found:
            return None
        events = _events(found[-1])
    traced = ops_of(events, name, instruction_parts(module), calls + 1)
    return traced if traced.calls else None


def _module_name(text: str) -> str:
    """The HLO module's name (``HloModule jit_forward, ...``): what each op event's ``hlo_module`` says."""
    first = text.split("\n", 1)[0].split()
    return first[1].rstrip(",") if len(first) > 1 and first[0] == "HloModule" else ""
