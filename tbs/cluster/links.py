"""What moving an activation between two machines costs: α + β·bytes through Ray's object store.

A task on the sending node makes a buffer of each size; a task on the receiving node fetches
it (``ray.get``, which pulls it over the network) and times the fetch. The line fitted per
ordered pair of node groups prices every device pair across those groups, so ``tbs recommend``
can weigh a split across machines, and refuses one it has no measured link for.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np

from tbs.cluster.discovery import NodeGroup
from tbs.measure.transfers import fit_line, pair_key

SIZES_BYTES = (4_096, 1_048_576, 16_777_216)
REPEATS = 3


def _pinned(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def measure_link(ray: Any, src: NodeGroup, dst: NodeGroup) -> dict[str, float]:
    """α (s) and β (s/byte) of a copy from ``src``'s first node to ``dst``'s, through the object store."""

    @ray.remote(num_cpus=0)
    def make(nbytes: int) -> np.ndarray:
        return np.ones(nbytes, dtype=np.uint8)

    @ray.remote(num_cpus=0)
    def fetch(refs: list[Any]) -> float:
        import time

        start = time.perf_counter()
        ray.get(refs[0])
        return time.perf_counter() - start

    sizes, seconds = [], []
    for nbytes in SIZES_BYTES:
        for _ in range(REPEATS):
            ref = make.options(scheduling_strategy=_pinned(src.nodes[0]["node_id"])).remote(nbytes)
            ray.wait([ref], fetch_local=False)  # made before the clock starts
            took = ray.get(fetch.options(scheduling_strategy=_pinned(dst.nodes[0]["node_id"])).remote([ref]))
            sizes.append(nbytes)
            seconds.append(took)
    return fit_line(sizes, seconds).as_dict()


def links(ray: Any, groups: list[NodeGroup], devices: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Transfer fits for every device pair across groups (``devices``: group -> its labelled devices)."""
    fits: dict[str, dict[str, float]] = {}
    for src, dst in permutations(groups, 2):
        fit = measure_link(ray, src, dst)
        for a in devices.get(src.name, []):
            for b in devices.get(dst.name, []):
                fits[pair_key(a, b)] = fit
    return fits
