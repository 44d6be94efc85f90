"""Layers folded and grouped for big models: the top layers, the rest in one fold, totals by kind and by block.

A block is where a layer sits in the model: its Keras nesting (``transformer_layer_3/attention``
is in ``transformer_layer_3``), or, where a model is flat, its name's prefix up to the last
part that carries a number (``conv2_block1_1_conv`` -> ``conv2_block1``, ``block2a_expand_conv``
-> ``block2a``). Keras's own automatic names (``conv2d_5``) say nothing about the block: such a
layer joins the next named layer's block (InceptionV3's ``mixed0`` closes its block). Nothing
here measures; every total is of measured cells only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from tbs.capture.categories import kind_of
from tbs.profiles.profile import Profile
from tbs.schema import USABLE

DEFAULT_TOP = 20  # layers (or groups) shown before the fold, in the console and the report
GROUPINGS = ("kind", "block")
_NUMBERED = re.compile(r"^[a-z]+\d+[a-z]*$")  # conv2, block1, block2a, mixed10: a part that names a block


def snake_case(class_name: str) -> str:
    """Keras's automatic layer name for a class (Conv2D -> conv2d, BatchNormalization -> batch_normalization)."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", re.sub(r"\W+", "", class_name))
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def is_automatic(name: str, layer_type: str) -> bool:
    """Whether ``name`` is the name Keras gives a ``layer_type`` nobody named (``dense``, ``dense_3``)."""
    return re.fullmatch(re.escape(snake_case(layer_type)) + r"(_\d+)?", name) is not None


def name_block(name: str) -> str | None:
    """The block a flat name's prefix gives: up to the last numbered part before the final one, else None."""
    parts = name.split("_")
    numbered = [i for i, part in enumerate(parts[:-1]) if _NUMBERED.match(part)]
    return "_".join(parts[:numbered[-1] + 1]) if numbered else None


def _outer_scope(names: list[str]) -> str:
    """A nesting scope that holds most of the model (ic_dr's ``inception_v3/``): its blocks are inside it."""
    scopes = pd.Series([n.split("/")[0] + "/" for n in names if "/" in n])
    if scopes.empty:
        return ""
    top, count = scopes.value_counts().index[0], int(scopes.value_counts().iloc[0])
    return top if count > len(names) / 2 else ""


def blocks(names: list[str], types: list[str]) -> list[str]:
    """Each layer's block (model order in, one block per layer out)."""
    outer = _outer_scope(names)
    found: list[str | None] = []
    for name, layer_type in zip(names, types):
        inner = name[len(outer):] if outer and name.startswith(outer) else name
        if "/" in inner:
            found.append(outer + inner.split("/")[0])
            continue
        if is_automatic(inner, layer_type):
            found.append(None)  # joins the next named layer's block
            continue
        found.append(outer + (name_block(inner) or inner.split("_")[0]))
    shared = pd.Series([b for b in found if b]).value_counts()
    for i, (name, block) in enumerate(zip(names, found)):
        if block and shared.get(block, 0) < 2 and "/" not in name[len(outer):]:
            found[i] = name  # a first part no other layer shares is no block: the layer is its own
    following: str | None = None
    for i in range(len(found) - 1, -1, -1):  # an automatic name joins the next named layer's block
        if found[i] is None:
            found[i] = following or names[i]
        elif not is_automatic(names[i].split("/")[-1], types[i]):
            following = found[i]
    return [str(b) for b in found]


def layer_groups(profile: Profile) -> pd.DataFrame:
    """One row per layer (model order): layer, kind, block."""
    records = profile.layers
    names = [r.name for r in records]
    return pd.DataFrame({"layer": names, "kind": [kind_of(r.type, r.category) for r in records],
                         "block": blocks(names, [r.type for r in records])})


@dataclass(frozen=True)
class Fold:
    """The rows shown before the fold, and what the fold holds: how many and their total per device."""

    shown: list[str]
    folded: list[str]
    folded_totals: dict[str, float]
    totals: dict[str, float]

    def share(self, device: str) -> float | None:
        """The fold's share of the device's total (None where nothing is measured)."""
        total = self.totals.get(device)
        return self.folded_totals.get(device, 0.0) / total if total else None


def rank(table: pd.DataFrame) -> list[str]:
    """Rows (index) heaviest first: by the largest share any device gives them (NaN: measured nowhere, last)."""
    share = table.div(table.sum(axis=0, min_count=1).where(lambda t: t > 0), axis=1).max(axis=1)
    return list(share.sort_values(ascending=False, kind="stable", na_position="last").index)


def fold(table: pd.DataFrame, top: int | None) -> Fold:
    """The ``top`` heaviest rows of a rows x devices table and the rest folded (``None``: every row, in order)."""
    totals = {d: float(v) for d, v in table.sum(axis=0, min_count=1).items() if pd.notna(v)}
    if top is None or len(table.index) <= top:
        return Fold(list(table.index), [], {}, totals)
    order = rank(table)
    shown, folded = order[:top], order[top:]
    rest = table.loc[folded].sum(axis=0, min_count=1)
    return Fold(shown, folded, {d: float(v) for d, v in rest.items() if pd.notna(v)}, totals)


def grouped(table: pd.DataFrame, groups: pd.DataFrame, by: str) -> tuple[pd.DataFrame, pd.Series]:
    """A layers x devices table summed per kind or block (measured cells only), and each group's layer count.

    Groups keep the order of their first layer; a group none of whose layers is measured on a device is NaN there.
    """
    keys = groups.set_index("layer")[by].reindex(table.index)
    summed = table.groupby(keys, sort=False).sum(min_count=1)
    return summed, keys.value_counts().reindex(summed.index)


def measured_table(summary: pd.DataFrame, layers: list[str], devices: list[str], batch: int,
                   column: str = "per_sample_s") -> pd.DataFrame:
    """Layers (model order) x devices: ``column`` of the usable cells at ``batch``; NaN where none."""
    cells = summary[(summary["batch_size"] == batch) & summary["status"].isin(USABLE) & summary[column].notna()]
    table = cells.pivot_table(index="layer", columns="device", values=column, aggfunc="first")
    return table.reindex(index=layers, columns=devices).astype(float)
