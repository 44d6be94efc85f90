"""Why no placement exists although every layer runs somewhere: the layer that no timed copy can reach.

The solvers only say that nothing fits; this names a layer and the devices on either side of it, so
``recommend`` can tell the user which profile to add (one line, never a solver's traceback).
"""

from __future__ import annotations

import math

from tbs.endpoints import GRAPH_OUTPUT, is_input_endpoint
from tbs.place.solvers import Problem, Tensor


def blocked_layer(problem: Problem) -> tuple[str, str] | None:
    """A layer no placement can give a device, and why, or None when none is found.

    Arc consistency over the tensors: a device stays a candidate for a layer while each
    tensor it reads or writes can stay on, or be copied (timed) to or from, a candidate device
    of the layer at the other end. A layer left without candidates is why nothing fits.
    """
    def name(end: str) -> str:
        return ("the model input" if is_input_endpoint(end) else "the model output" if end == GRAPH_OUTPUT
                else f"'{end}'")

    domains = {l: set(problem.runs_on(l)) for l in problem.layers}
    for layer, devices in domains.items():
        if not devices:
            return layer, "no device can run it"

    def allowed(t: Tensor, src_device: str, dst_device: str) -> bool:
        return src_device == dst_device or math.isfinite(problem.copy_cost(t, src_device, dst_device))

    ends = [(t, c) for t in problem.tensors for c in t.consumers]
    changed = True
    while changed:
        changed = False
        for t, c in ends:
            for layer, other, reads in ((t.src, c, False), (c, t.src, True)):
                if layer not in domains:  # the model's input or output: fixed on the host
                    continue
                there = domains.get(other, {problem.host})
                keep = {x for x in domains[layer]
                        if any(allowed(t, y, x) if reads else allowed(t, x, y) for y in there)}
                if keep == domains[layer]:
                    continue
                if not keep:
                    return layer, (f"it can go only on {', '.join(sorted(domains[layer]))} and {name(other)}, which it "
                                   f"{'reads' if reads else 'feeds'}, only on {', '.join(sorted(there))}, and no copy "
                                   f"between those devices was timed")
                domains[layer], changed = keep, True
    return None
