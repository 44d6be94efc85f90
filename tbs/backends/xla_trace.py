"""Reading XLA's kernels out of a profiler trace (either backend): which run each kernel belongs to, and when it ends.

On XLA:CPU every thunk is an event named by its HLO instruction (stat ``hlo_op``). An asynchronous
thunk (a convolution or a GEMM handed to a thread pool) returns at once; its ``end: <name>`` event
(``_c`` = the thunk's ``_p``) is recorded when its completion is handled, which can be after the
ops that read its result have run, so a kernel ends at that event or at the next kernel's start,
whichever comes first (what waited for it). No framework is imported here.
"""

from __future__ import annotations

from typing import Any, Iterable

Event = tuple[str, float, float, dict[str, Any]]  # (name, start_ns, duration_ns, stats)
Op = tuple[str, float, float]  # (HLO instruction, start_ns, end_ns)


def kernels(events: Iterable[Event], runs: list[tuple[float, float]] | None = None,
            module: str | None = None, calls: int | None = None) -> list[list[Op]]:
    """The XLA kernels per run, in run order. A run is the events sharing a ``run_id`` (JAX on a CPU), or where the
    framework gives none (TensorFlow's XLA: -1), the ``runs`` spans (start_ns, end_ns) that contain them; where no
    kernel has a run id (a GPU's kernels, as CUPTI records them) and ``calls`` sequential calls were traced, the
    kernels split at the widest idle gaps (``split_at_gaps``)."""
    events = list(events)
    ends = {stats["_c"]: start + duration for name, start, duration, stats in events
            if name.startswith("end: ") and "_c" in stats}
    grouped: dict[Any, list[Op]] = {}
    for name, start, duration, stats in events:
        if "hlo_op" not in stats or (module is not None and stats.get("hlo_module") != module):
            continue
        end = max(start + duration, ends.get(stats.get("_p"), 0.0))
        if runs is not None:
            key: Any = next((i for i, (first, last) in enumerate(runs) if first <= start <= last), None)
            if key is None:
                continue
        else:
            key = stats.get("run_id")
        grouped.setdefault(key, []).append((str(stats["hlo_op"]), start, end))
    if runs is None and calls and list(grouped) == [None]:
        return [waited_for(ops) for ops in split_at_gaps(grouped[None], calls)]
    return [waited_for(ops) for ops in sorted(grouped.values(), key=lambda ops: min(s for _, s, _ in ops))]


def split_at_gaps(ops: list[Op], calls: int) -> list[list[Op]]:
    """The kernels of ``calls`` calls run one after another, each waited for before the next is dispatched: split
    where the device sat idle longest (the host's wait and the next dispatch, ~0.4 ms on an H200, against a few µs
    between the kernels of one program). Fewer kernels than calls: one run, which says nothing of the calls."""
    ops = sorted(ops, key=lambda op: op[1])
    if calls <= 1 or len(ops) < calls:
        return [ops] if ops else []
    idle, latest = [], ops[0][2]
    for i in range(1, len(ops)):
        idle.append((ops[i][1] - latest, i))
        latest = max(latest, ops[i][2])
    cuts = sorted(i for _, i in sorted(idle, reverse=True)[:calls - 1])
    return [ops[a:b] for a, b in zip([0, *cuts], [*cuts, len(ops)])]


def waited_for(ops: list[Op]) -> list[Op]:
    """Each kernel ending no later than the next kernel's start (an async thunk's end event comes late)."""
    ops = sorted(ops, key=lambda op: op[1])
    return [(name, start, min(end, ops[i + 1][1]) if i + 1 < len(ops) and ops[i + 1][1] > start else end)
            for i, (name, start, end) in enumerate(ops)]
