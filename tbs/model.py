"""Load a user's model: .pkl/.pickle (pickle/cloudpickle) or .keras (safe mode).

Custom layers need their classes: --custom-objects FILE.py is imported first and
every class or function it defines is offered to Keras's loader. When a class is
still missing, the error names it and says to pass --custom-objects.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pickle
import re
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from tbs.errors import ModelLoadError, TbsError
from tbs.backend import keras as _keras

PICKLE_SUFFIXES = (".pkl", ".pickle")
KERAS_SUFFIXES = (".keras",)


@dataclass
class LoadedModel:
    model: Any
    path: Path
    name: str
    sha256: str
    format: str

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "keras_name": getattr(self.model, "name", None),
            "class": type(self.model).__name__,
            "path": str(self.path),
            "sha256": self.sha256,
            "format": self.format,
            "params": int(self.model.count_params()) if getattr(self.model, "built", False) else None,
        }


def import_custom_objects(paths: list[Path]) -> dict[str, Any]:
    """Import each user file and return the classes and functions it defines, by name."""
    found: dict[str, Any] = {}
    for index, path in enumerate(paths):
        path = Path(path)
        if not path.is_file():
            raise TbsError(f"--custom-objects: file '{path}' does not exist; pass the .py file defining your layers")
        module_name = f"tbs_custom_objects_{index}_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise TbsError(f"--custom-objects: '{path}' is not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise TbsError(
                f"--custom-objects: importing '{path}' failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == module_name:
                found[name] = obj
    return found


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_MISSING_CLASS = (
    re.compile(r"Could not locate (?:class|function) '([^']+)'"),
    re.compile(r"Can't get attribute '([^']+)' on"),
    re.compile(r"Unknown (?:layer|object|class)[^']*'([^']+)'"),
    re.compile(r"No module named '([^']+)'"),
)


def _missing_name(exc: BaseException) -> str | None:
    text = str(exc)
    for pattern in _MISSING_CLASS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def check_model_file(path: Path) -> None:
    """Fail fast, before TensorFlow is imported, on a missing, empty or unsupported file."""
    if not path.exists():
        raise ModelLoadError(f"model file '{path}' does not exist; check the path (example models: python models/build.py)")
    if not path.is_file():
        raise ModelLoadError(f"'{path}' is a directory, not a model file; pass a .pkl, .pickle or .keras file")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"model file '{path}' is empty; re-save the model")
    if path.suffix.lower() not in PICKLE_SUFFIXES + KERAS_SUFFIXES:
        raise ModelLoadError(
            f"model file '{path}' has unsupported format '{path.suffix}'; save it as .keras, or pickle it to .pkl"
        )


def load_model(path: Path, custom_objects: dict[str, Any] | None = None,
               scope: Callable[[], ContextManager] = nullcontext) -> LoadedModel:
    """Load and validate a model; every failure becomes a one-line ModelLoadError."""
    path = Path(path)
    check_model_file(path)
    keras = _keras()
    custom_objects = custom_objects or {}
    suffix = path.suffix.lower()
    try:
        with scope(), keras.saving.custom_object_scope(custom_objects):
            if suffix in PICKLE_SUFFIXES:
                import cloudpickle  # noqa: F401  (registers reducers cloudpickle-made files may need)

                with open(path, "rb") as f:
                    model = pickle.load(f)
                fmt = "pickle"
            else:
                model = keras.saving.load_model(path, custom_objects=custom_objects, compile=False, safe_mode=True)
                fmt = "keras"
    except Exception as exc:
        missing = _missing_name(exc)
        if missing:
            raise ModelLoadError(
                f"model '{path}' needs '{missing}', which is not defined here; "
                f"pass --custom-objects FILE.py with the code that defines it"
            ) from None
        if isinstance(exc, (pickle.UnpicklingError, EOFError)) or "zip" in str(exc).lower():
            raise ModelLoadError(f"model file '{path}' is corrupt or truncated ({_first_line(exc)}); re-save the model") from None
        raise ModelLoadError(f"cannot load model '{path}': {_first_line(exc)}") from None
    if not isinstance(model, keras.Model):
        what = "a Keras layer" if isinstance(model, keras.layers.Layer) else f"a {type(model).__module__}.{type(model).__name__}"
        raise ModelLoadError(f"'{path}' holds {what}, not a Keras model; pickle or save a keras.Model")
    if not model.built:
        raise ModelLoadError(f"model in '{path}' was never built; call it once on data (or build it) before saving")
    return LoadedModel(model=model, path=path, name=path.stem, sha256=_file_sha256(path), format=fmt)
