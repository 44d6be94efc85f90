"""Which layer of NEW is which layer of BASE: by name, then renamed ones by kind, shapes and position.

A name matches when the layer under it is of the same type (Keras numbers unnamed layers, so
inserting one shifts every later ``dense_N``: a Dense named like a Conv2D is not that Conv2D).
The layers left on both sides are paired as renamed when they have the same type and the same
input and output shapes (the batch dimension aside), the nearest in relative position winning.
What is left is removed (BASE only) or added (NEW only).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tbs.profiles.profile import Profile
from tbs.schema import LayerRecord

SAME, RENAMED, ADDED, REMOVED = "same", "renamed", "added", "removed"
MATCH_COLUMNS = ["base_layer", "new_layer", "match", "layer_type", "how"]


@dataclass(frozen=True)
class Layer:
    name: str
    type: str | None
    shapes: tuple | None  # (inputs, outputs) without the batch dimension; None where not captured
    position: float  # 0 (first) .. 1 (last)


def _no_batch(shapes: list | None, batch: int | None) -> tuple | None:
    if shapes is None:
        return None
    return tuple(tuple(s[1:] if s and batch is not None and s[0] == batch else s) for s in shapes)


def layers_of(profile: Profile) -> list[Layer]:
    """Every layer in call order: the recorded ones, then any row the records lack (the loss)."""
    records: list[LayerRecord] = profile.layers
    names = {r.name for r in records}
    extra = [str(n) for n in dict.fromkeys(profile.summary["layer"].dropna()) if str(n) not in names]
    total = max(len(records) + len(extra) - 1, 1)
    out = []
    for i, r in enumerate(records):
        shapes = None
        if r.input_shapes is not None and r.output_shapes is not None:
            shapes = (_no_batch(r.input_shapes, r.batch_size), _no_batch(r.output_shapes, r.batch_size))
        out.append(Layer(r.name, r.type, shapes, i / total))
    kinds = profile.summary.drop_duplicates("layer").set_index("layer")["layer_type"] if len(profile.summary) else {}
    out += [Layer(n, str(kinds.get(n)) if n in kinds else None, None, (len(records) + i) / total)
            for i, n in enumerate(extra)]
    return out


def match_layers(base: Profile, new: Profile) -> pd.DataFrame:
    """One row per layer of either side: base_layer, new_layer, match (same/renamed/added/removed), how."""
    mine, theirs = layers_of(base), layers_of(new)
    by_name = {layer.name: layer for layer in theirs}
    rows, taken = [], set()
    for layer in mine:
        other = by_name.get(layer.name)
        if other is not None and (layer.type == other.type or None in (layer.type, other.type)):
            changed = layer.shapes is not None and other.shapes is not None and layer.shapes != other.shapes
            rows.append(dict(base_layer=layer.name, new_layer=other.name, match=SAME, layer_type=layer.type,
                             how="its shapes changed" if changed else ""))
            taken.add(other.name)
    matched = {r["base_layer"] for r in rows}
    left_new = [layer for layer in theirs if layer.name not in taken]
    for layer in mine:
        if layer.name in matched:
            continue
        candidates = [o for o in left_new if o.type == layer.type and layer.shapes is not None
                      and o.shapes == layer.shapes]
        if candidates:
            other = min(candidates, key=lambda o: abs(o.position - layer.position))
            left_new.remove(other)
            rows.append(dict(base_layer=layer.name, new_layer=other.name, match=RENAMED, layer_type=layer.type,
                             how=f"same type ({layer.type}) and shapes, nearest position"))
        else:
            rows.append(dict(base_layer=layer.name, new_layer=None, match=REMOVED, layer_type=layer.type, how=""))
    rows += [dict(base_layer=None, new_layer=o.name, match=ADDED, layer_type=o.type, how="") for o in left_new]
    return _in_order(pd.DataFrame(rows, columns=MATCH_COLUMNS), [l.name for l in theirs], [l.name for l in mine])


def named(value: object) -> bool:
    """Whether a match's side names a layer (a missing side is None, or NaN once in a frame)."""
    return isinstance(value, str)


def _in_order(frame: pd.DataFrame, new_order: list[str], base_order: list[str]) -> pd.DataFrame:
    """NEW's layer order, each removed layer after the BASE layer it followed."""
    new_rank = {name: i for i, name in enumerate(new_order)}
    base_rank = {name: i for i, name in enumerate(base_order)}
    matched = {b: new_rank[n] for b, n in zip(frame["base_layer"], frame["new_layer"]) if named(b) and named(n)}

    def rank(row: pd.Series) -> float:
        if named(row["new_layer"]):
            return float(new_rank[row["new_layer"]])
        before = [matched[b] for b in base_order[:base_rank[row["base_layer"]]] if b in matched]
        return (max(before) if before else -1) + 0.5

    if frame.empty:
        return frame
    return (frame.assign(_rank=frame.apply(rank, axis=1)).sort_values("_rank", kind="stable")
            .drop(columns="_rank").reset_index(drop=True))
