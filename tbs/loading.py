"""Saved profiles read for the API: one or more directories merged into one, re-priced if asked.

Every verb that takes a profile takes a ``Profile`` or a directory (``as_profile``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from tbs import checks
from tbs.cost.prices import load_price_file
from tbs.cost.reprice import reprice
from tbs.errors import ProfileError, TbsError
from tbs.profiles.merge import merge_each_mode, merge_profiles
from tbs.profiles.profile import Profile, load_profile

PathLike = str | os.PathLike


def load(*directories: PathLike, prices: str | Mapping[str, float] | None = None,
         spot: str | Mapping[str, float] | None = None, price_file: PathLike | None = None) -> Profile:
    """Saved profiles, merged into one (devices named by host and backend), re-priced if prices are given."""
    return _priced(merge_profiles(_read(directories)), prices, spot, price_file)


def load_modes(*directories: PathLike, prices: str | Mapping[str, float] | None = None,
               spot: str | Mapping[str, float] | None = None,
               price_file: PathLike | None = None) -> tuple[Profile, Profile | None]:
    """Like ``load``; given inference and training profiles of one model, returns (training, inference), each merged."""
    main, other = merge_each_mode(_read(directories))
    return (_priced(main, prices, spot, price_file),
            None if other is None else _priced(other, prices, spot, price_file))


def _read(directories: tuple[PathLike, ...]) -> list[Profile]:
    if not directories:
        raise TbsError("give at least one profile directory, e.g. tbs report profiles/cnn_flowers")
    loaded = []
    for directory in directories:
        checks.path("directories", directory, "a profile directory", optional=False)
        if not Path(directory).is_dir():
            raise ProfileError(f"profile directory '{directory}' does not exist; run tbs profile first")
        loaded.append(load_profile(Path(directory)))
    return loaded


def _priced(result: Profile, prices: Any, spot: Any, price_file: PathLike | None) -> Profile:
    price_file = checks.path("price_file", price_file, "a CSV or YAML price list")
    table, sources = load_price_file(str(price_file)) if price_file is not None else ({}, {})
    table.update(checks.prices(prices))
    discounts = checks.spot(spot)
    if table or discounts:  # devices not named keep the prices they were profiled with
        result = reprice(result, table, discounts)
        result.metadata["price_sources"] = sources
    return result


def as_profile(profile: Any, name: str = "profile") -> Profile:
    if isinstance(profile, Profile):
        return profile
    if not checks.is_path(profile):
        raise TbsError(f"{name}: {type(profile).__name__} is neither a tbs.Profile nor a profile directory")
    return load(profile)
