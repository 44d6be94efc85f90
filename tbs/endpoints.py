"""The layer graph's endpoint names, and a graph of an older profile format read in them.

The graph (``metadata.json``'s ``graph``: batch -> edges) names its edges' ends by layer call; a
model input and the model's outputs need names no call can take. Format 6 made them so
(``tbs.schema``'s history); ``current_graph`` reads the older ``input:<name>`` and ``output``.
"""

from __future__ import annotations

from typing import Any, Mapping

# The layer graph's endpoints. Keras refuses "/" in any layer, model or input name, and the capture
# joins a nested call's names with it, so no call or input name starts with "/": these never meet one.
GRAPH_INPUT = "/input"  # a model input's edges come from "/input/<input name>"; a split runner's Source tag
GRAPH_OUTPUT = "/output"  # where the model's outputs go (the host in inference, the loss in training)


def input_endpoint(name: str) -> str:
    """The graph's name for the model input called ``name``."""
    return f"{GRAPH_INPUT}/{name}"


def is_input_endpoint(name: str) -> bool:
    """Whether a graph edge's source is a model input (on the host), not a layer."""
    return name.startswith(GRAPH_INPUT + "/")


def current_graph(graph: Mapping[str, list[dict[str, Any]]], version: int,
                  layers: set[str]) -> dict[str, list[dict[str, Any]]]:
    """A profile's graph in this version's endpoint names (``layers``: its recorded layer names).

    Versions before 6 wrote ``input:<name>`` and ``output``: a source so named is an input unless it is a
    recorded layer, and an edge into ``output`` goes to the model's output, unless a layer is named
    ``output``: then only that layer's own edge does (a layer never feeds itself).
    """
    if version >= 6:
        return dict(graph)

    def src(name: str) -> str:
        return input_endpoint(name[len("input:"):]) if name.startswith("input:") and name not in layers else name

    def dst(edge: Mapping[str, Any]) -> str:
        sink = edge["dst"] == "output" and ("output" not in layers or edge["src"] == "output")
        return GRAPH_OUTPUT if sink else edge["dst"]

    return {batch: [dict(e, src=src(e["src"]), dst=dst(e)) for e in edges] for batch, edges in graph.items()}
