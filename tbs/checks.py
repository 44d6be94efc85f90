"""Arguments of the Python API, checked at the boundary: a wrong type or value is one TbsError line.

The CLI's click types check its flags; a Python caller gets the same care here,
with messages that name the argument (and the flag it matches).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tbs.backends.base import parse_device_tokens
from tbs.cost.prices import parse_prices, parse_spot, prices_from_mapping, spot_from_mapping
from tbs.errors import TbsError
from tbs.measure.config import TrainingConfig


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TbsError(f"{name}={value!r}: give True or False")
    return bool(value)


def whole(name: str, value: Any, least: int | None = None, hint: str = "") -> int:
    """A whole number (not a bool, not text), at least ``least``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TbsError(f"{name}={value!r}: give a whole number{hint}")
    if least is not None and value < least:
        raise TbsError(f"{name}={value!r}: must be at least {least}{hint}")
    return int(value)


def positive(name: str, value: Any, flag_name: str) -> float | None:
    """None, or a number above 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not value > 0:
        raise TbsError(f"{name}={value!r}: give a number above 0 ({flag_name})")
    return float(value)


def batch_sizes(sizes: Any) -> list[int]:
    """Whole numbers of at least 1, sorted, each once."""
    if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
        sizes = [sizes]
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise TbsError(f"batch_sizes={sizes!r}: give whole numbers, e.g. batch_sizes=[32, 512] (--batch 32,512)")
    checked = [whole("batch_sizes", s, 1, "; e.g. batch_sizes=[32, 512]") for s in sizes]
    if not checked:
        raise TbsError("batch_sizes: no batch size given; e.g. batch_sizes=[32, 512] (--batch 32,512)")
    return sorted(set(checked))


def device_tokens(devices: Any) -> list[str] | None:
    if devices is None:
        return None
    if isinstance(devices, str):
        return parse_device_tokens(devices)
    if not isinstance(devices, Sequence) or not all(isinstance(d, str) for d in devices):
        raise TbsError(f"devices={devices!r}: give device kinds or names, e.g. devices=['cpu', 'gpu:0']")
    return parse_device_tokens(",".join(devices))


def prices(value: Any, name: str = "prices") -> dict[str, float]:
    """Text ('cpu=0.5,gpu=3') or a mapping (values as numbers or '3/h', 'capex:25000/1y')."""
    if value is None:
        return {}
    if isinstance(value, str):
        return parse_prices(value, name)
    if isinstance(value, Mapping):
        return prices_from_mapping(value, name)
    raise TbsError(f"{name}={value!r}: give a dict such as {{'cpu': 0.5, 'gpu': 3}} or text 'cpu=0.5,gpu=3'")


def spot(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if isinstance(value, str):
        return parse_spot(value, "spot")
    if isinstance(value, Mapping):
        return spot_from_mapping(value)
    raise TbsError(f"spot={value!r}: give a dict of discount fractions such as {{'tpu': 0.7}} (70% off)")


def config(name: str, value: Any, kind: type) -> Any:
    """A settings dataclass (TimingConfig, MeasureConfig): None means its defaults."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TbsError(f"{name}={type(value).__name__}: give a tbs.{kind.__name__}(...), e.g. "
                       f"{name}=tbs.{kind.__name__}() with the fields to change")
    return value


def is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def path(name: str, value: Any, what: str, optional: bool = True) -> Path | None:
    """A file or directory path (None where optional)."""
    if value is None and optional:
        return None
    if not is_path(value) or not str(value).strip():
        raise TbsError(f"{name}={value!r}: give {what} as a path (a str or pathlib.Path)")
    return Path(value)


def text(name: str, value: Any, example: str, optional: bool = True) -> str | None:
    """A non-blank string (None where optional)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TbsError(f"{name}={value!r}: give text, e.g. {name}={example!r}")
    return value


def names(name: str, value: Any, example: str) -> list[str]:
    """Names as one comma-separated string or a list of strings ('l4,h100' or ['l4', 'h100'])."""
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable) or \
            not all(isinstance(i, str) for i in items):
        raise TbsError(f"{name}={value!r}: give names as text or a list of text, e.g. {name}={example}")
    chosen = [i.strip() for i in items if i.strip()]
    if not chosen:
        raise TbsError(f"{name}={value!r}: no name given, e.g. {name}={example}")
    return chosen


def input_data(value: Any, name: str = "input") -> Any:
    """None, a data file, or arrays: one array, a list or tuple of them, or a dict by input name."""
    if value is None or is_path(value) or isinstance(value, (np.ndarray, list, tuple, Mapping)) or \
            (hasattr(value, "shape") and hasattr(value, "dtype")):
        return value
    raise TbsError(f"{name}={value!r}: give a .npy/.npz/.pkl file or arrays (one array, a list, or a dict by input name)")


def model_or_path(value: Any, name: str = "model") -> Any:
    """A model file path or an in-memory keras.Model (anything else is refused before a framework loads)."""
    if value is None or (not is_path(value) and not hasattr(value, "count_params")):
        raise TbsError(f"{name}: {type(value).__name__} is neither a model file path nor a keras.Model")
    return value


def custom_objects(value: Any) -> Any:
    """None, a dict of classes, or .py files (one path or several)."""
    if value is None or isinstance(value, Mapping):
        return value
    paths = [value] if is_path(value) else value
    if isinstance(paths, (bytes, str)) or not isinstance(paths, Iterable) or not all(is_path(p) for p in paths):
        raise TbsError(f"custom_objects={value!r}: give .py files defining your layers, or a dict of classes by name")
    return [Path(p) for p in paths]


def training(value: Any) -> TrainingConfig | None:
    """None for inference; True is the model's own (or stand-in) loss and optimizer."""
    if isinstance(value, TrainingConfig):
        return value
    return TrainingConfig() if flag("training", value) else None


def dataset_size(value: Any) -> int | None:
    """The dataset's size in samples (the report's cost per epoch), or None."""
    return None if value is None else whole("dataset_size", value, 1, " (--dataset-size: the dataset's size)")
