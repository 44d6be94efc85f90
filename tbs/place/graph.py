"""The layer graph as the optimiser sees it: the tensors that cross between placed layers, and their gradients.

A tensor is one produced value with all its readers: placing its readers on other devices
than its producer costs one copy per device. In training, a gradient flows back along
every edge that needs one, and the layers a compiled train step never runs are bypassed.
"""

from __future__ import annotations

from typing import Any

from tbs.place.solvers import Tensor
from tbs.endpoints import GRAPH_OUTPUT, is_input_endpoint
from tbs.schema import LOSS_LAYER


def bypass(edges: list[dict[str, Any]], skipped: list[str]) -> list[dict[str, Any]]:
    """The graph without the layers the step never runs: their readers read what fed them (the logits)."""
    if not skipped:
        return edges
    fed = {e["dst"]: e["src"] for e in edges if e["dst"] in skipped}
    return [dict(e, src=fed.get(e["src"], e["src"])) for e in edges if e["dst"] not in skipped]


def graph_tensors(edges: list[dict[str, Any]], layers: list[str], mode: str = "inference") -> list[Tensor]:
    """The graph's edges as tensors (one per produced value, with all its readers), and their gradients.

    In training the model's outputs feed the loss, not the host, so edges to ``/output``
    are dropped where the graph has a loss; an edge with ``grad`` adds the gradient that
    flows back along it, paid once per device its readers sit on.
    """
    training = mode == "training" and any(e["dst"] == LOSS_LAYER for e in edges)
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for e in edges:
        if training and e["dst"] == GRAPH_OUTPUT:
            continue
        grouped.setdefault((e["src"], tuple(e.get("shape") or []), e.get("dtype"), int(e["bytes"])), []).append(e)
    tensors = []
    for (src, _, _, nbytes), group in grouped.items():
        if not (is_input_endpoint(src) or src in layers):
            continue
        tensors.append(Tensor(src, tuple(dict.fromkeys(e["dst"] for e in group)), nbytes))
        back = tuple(dict.fromkeys(e["dst"] for e in group if e.get("grad")))
        if back and mode == "training":
            tensors.append(Tensor(src, back, nbytes, grad=True))
    return tensors
