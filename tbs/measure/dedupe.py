"""Identical layer calls measured once: a network's repeated blocks compile to the same programs.

Two calls with the same operation type, configuration (its name aside), input shapes and dtypes,
scalar arguments, device and mode (in training: the same input gradients, the same optimizer)
run the same programs: their weights' values change neither the time, nor the FLOPs, nor the
bytes. One representative is compiled, analysed and sampled; every other call gets the
representative's row under its own name, with ``shared_with`` naming it. They stay visible
everywhere (every layer keeps its row, and is summed), never merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from tbs.backends.tensors import dtype_name, iter_tensors
from tbs.capture.recorder import LayerCall


def call_signature(call: LayerCall | None, device: str, mode: str, extra: Hashable = ()) -> tuple | None:
    """What fixes a call's programs; None where it cannot be told (no configuration): then it stands alone.

    ``extra`` adds what the mode makes part of a program (in training: which input gradients it
    computes, whether the step runs all of it).
    """
    if call is None:
        return None
    try:
        config = dict(call.op.get_config())
    except Exception:  # a layer without a config: analysed and measured on its own
        return None
    config.pop("name", None)
    scalars = sorted((k, v) for k, v in call.kwargs.items() if isinstance(v, (bool, int, float, str, type(None))))
    dtypes = [dtype_name(x) for x in iter_tensors((call.args, call.kwargs))]
    return (device, mode, call.type, repr(sorted(config.items())), repr(call.input_shapes), repr(dtypes),
            repr(call.output_shapes), repr(sorted(call.kwargs)), repr(scalars), bool(call.inactive), extra)


@dataclass
class Shared:
    """The calls of one (device, batch) that repeat an earlier one: key -> the representative's key."""

    of: dict[Hashable, Hashable] = field(default_factory=dict)  # duplicate -> representative
    bases: dict[Hashable, dict[str, Any]] = field(default_factory=dict)  # duplicate -> its own row identity

    def duplicates(self, representative: Hashable) -> list[Hashable]:
        return [key for key, rep in self.of.items() if rep == representative]


def find_shared(cells: dict[Hashable, Any], signature: Callable[[Hashable], tuple | None]) -> Shared:
    """Group pending cells by signature: the first of each group (in model order) is measured for the rest."""
    first: dict[tuple, Hashable] = {}
    shared = Shared()
    for key in cells:
        sig = signature(key)
        if sig is None:
            continue
        if sig in first:
            shared.of[key] = first[sig]
        else:
            first[sig] = key
    return shared


def shared_row(row: dict[str, Any], base: dict[str, Any], representative: str) -> dict[str, Any]:
    """A duplicate's row: the representative's measurement under the duplicate's own name."""
    return dict(row, **base, shared_with=representative)
