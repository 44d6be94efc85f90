"""What a profiler trace of a compiled program looks like on this machine's accelerator, and what tbs reads from it.

    python benchmarks/gpu/trace_check.py          # the GPU where there is one, else the CPU (the dry run)

The H200's profiles have no layer times inside the compiled model: tbs's reading of the trace
(``tbs.backends.jax.trace``) found no op of the program there. It was written for XLA:CPU's events, where
every kernel carries its run's id; a GPU's kernels, as CUPTI records them, are thought to carry none, and
are now split into calls at the widest idle gaps. This step prints, for one small program (a convolution, a
ReLU, a matmul) traced for 3 calls: every plane with its lines and event counts, the stat keys of the events
that name an HLO instruction, a few of those events whole, and then what ``trace_calls`` makes of the same
program. Its output lands in steps.log, so the next change to the reading is made from the real format.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHOWN_EVENTS = 6


def program(jax, device):
    """A jitted convolution, ReLU and matmul, and its arguments on ``device``."""
    import numpy as np

    def forward(x, kernel, weights):
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.numpy.maximum(y, 0.0).reshape(x.shape[0], -1) @ weights

    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal(s).astype(np.float32), device)
            for s in ((32, 32, 32, 16), (3, 3, 16, 32), (32 * 32 * 32, 64))]
    return jax.jit(forward), args


def raw_events(jax, jitted, args) -> list:
    """(plane, line, name, duration_ns, stats) of every event of 3 traced calls."""
    from jax.profiler import ProfileData

    jax.block_until_ready(jitted(*args))
    with tempfile.TemporaryDirectory(prefix="tbs-trace-check-") as directory:
        jax.profiler.start_trace(directory)
        for _ in range(3):
            jax.block_until_ready(jitted(*args))
        jax.profiler.stop_trace()
        found = sorted(Path(directory).rglob("*.xplane.pb"))
        data = ProfileData.from_file(str(found[-1]))
        return [(plane.name, line.name, e.name, float(e.duration_ns), dict(e.stats))
                for plane in data.planes for line in plane.lines for e in line.events]


def main() -> int:
    import jax

    from tbs.backends.jax.trace import trace_calls

    device = next((d for d in jax.devices() if d.platform == "gpu"), jax.devices("cpu")[0])
    print(f"device: {device} ({device.device_kind}); jax {jax.__version__}")
    jitted, args = program(jax, device)
    events = raw_events(jax, jitted, args)
    for (plane, line), count in Counter((p, l) for p, l, *_ in events).items():
        print(f"plane {plane!r} line {line!r}: {count} events")
    named = [e for e in events if "hlo_op" in e[4]]
    keys = Counter(k for *_, stats in named for k in stats)
    print(f"{len(named)} events name an HLO instruction; their stat keys: {dict(keys)}")
    for plane, line, name, duration, stats in named[:SHOWN_EVENTS]:
        short = {k: (str(v)[:80]) for k, v in stats.items()}
        print(f"  {plane} / {line}: {name[:60]!r} {duration / 1e3:.1f} us {short}")
    traced = trace_calls(jitted, tuple(args), 3)
    if traced is None:
        print("trace_calls: no op of the program found")
        return 1
    ops = Counter(op.call for op in traced.ops)
    print(f"trace_calls: {len(traced.calls)} calls ({', '.join(f'{s * 1e6:.1f} us' for _, s in traced.calls)}), "
          f"ops per call {dict(ops)}: {', '.join(sorted({op.name for op in traced.ops}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
