"""metadata.json's values checked against ``tbs.schema.Metadata``'s types, nested records included.

``Metadata`` declares each key and its type (the nested records as ``TypedDict``s in
``tbs.schema``); reading a profile checks the values too, so a damaged one is refused in one
line naming the file and the key (``capacity['cpu:0'].largest_batch``) instead of failing
later inside a renderer. Keys ``Metadata`` does not declare (a newer writer's) and keys a
record does not declare are let through; None is a missing value anywhere (blank, never refused).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Mapping

from tbs.errors import ProfileError
from tbs.schema import METADATA_KEYS, Metadata


def check_metadata(metadata: Mapping[str, Any], where: str) -> None:
    """Refuse a declared key whose value does not have its type, in one line naming ``where`` and the key."""
    hints = _metadata_hints()
    for name in METADATA_KEYS:
        value = metadata.get(name)
        wrong = _misfit(value, hints[name], name)
        if wrong is not None:
            path, found, hint = wrong
            raise ProfileError(f"'{where}': key {path} is {_shown(found)}, not {_described(hint)}; fix or remove it, "
                               f"or re-run tbs profile")


@functools.cache
def _metadata_hints() -> dict[str, Any]:
    """``Metadata``'s field types, resolved once (its annotations are strings)."""
    return typing.get_type_hints(Metadata)


def _misfit(value: Any, hint: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first place where ``value`` does not have type ``hint``: (its path, the value there, the type wanted)."""
    if value is None or hint is Any:
        return None
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return None if any(_misfit(value, h, path) is None for h in args) else (path, value, hint)
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return path, value, hint
        for key, inner in typing.get_type_hints(hint).items():
            found = _misfit(value.get(key), inner, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if origin is list:
        if not isinstance(value, list):
            return path, value, hint
        return next((m for i, v in enumerate(value) if (m := _misfit(v, args[0], f"{path}[{i}]")) is not None), None)
    if origin is dict:
        if not isinstance(value, dict):
            return path, value, hint
        return next((m for k, v in value.items() if (m := _misfit(v, args[1], f"{path}[{k!r}]")) is not None), None)
    return None if _is_scalar(value, hint) else (path, value, hint)


def _is_scalar(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):  # a float takes an int; neither takes a bool
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _described(hint: Any) -> str:
    """A type as a reader of the message says it."""
    if typing.is_typeddict(hint):
        return f"a {hint.__name__} (a JSON object)"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_described(h) for h in typing.get_args(hint) if h is not type(None))
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", list: "a list",
             dict: "a JSON object"}
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
