"""Load a user's model: .pkl/.pickle (pickle/cloudpickle), .keras or a Keras 2-era .h5/.hdf5 (both in
safe mode), or an in-memory keras.Model. A TensorFlow SavedModel directory is refused with one line:
Keras 3 reloads it only as an opaque inference function, with no layers to time one by one.

Custom layers need their classes: --custom-objects FILE.py is imported first and
every class or function it defines is offered to Keras's loader. When a class is
still missing, the error names it and says to pass --custom-objects.

An in-memory model is pickled to bytes once and unpickled once per device, so
each device gets its own copy (its variables made under that device's scope)
and the caller's model is never touched; no file is written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pickle
import re
import sys
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np

from tbs.errors import ModelLoadError, TbsError
from tbs.backends import keras as _keras

PICKLE_SUFFIXES = (".pkl", ".pickle")
KERAS_SUFFIXES = (".keras",)
H5_SUFFIXES = (".h5", ".hdf5")  # Keras's legacy format: keras.saving.load_model reads it, safe mode included
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVE_AS_KERAS = "save the Keras model itself with model.save('model.keras') where it is built, and profile that file"


@dataclass
class LoadedModel:
    model: Any
    path: Path | None  # None: an in-memory model, no file
    name: str
    sha256: str
    format: str
    # Why the model's own compile() (loss, optimizer) could not be restored; "" when it was, or was never asked.
    compile_note: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "keras_name": getattr(self.model, "name", None),
            "class": type(self.model).__name__,
            "path": None if self.path is None else str(self.path),
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
    saved_model = path if path.is_dir() else path.parent if path.name in SAVED_MODEL_FILES else None
    if saved_model is not None and any((saved_model / name).is_file() for name in SAVED_MODEL_FILES):
        raise ModelLoadError(f"'{saved_model}' is a TensorFlow SavedModel, from which Keras 3 cannot rebuild the "
                             f"layers tbs times; {SAVE_AS_KERAS}")
    if not path.is_file():
        raise ModelLoadError(f"'{path}' is a directory, not a model file; pass a .pkl, .pickle, .keras or .h5 file")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"model file '{path}' is empty; re-save the model")
    if path.suffix.lower() not in PICKLE_SUFFIXES + KERAS_SUFFIXES + H5_SUFFIXES:
        raise ModelLoadError(
            f"model file '{path}' has unsupported format '{path.suffix}'; save it as .keras or .h5, or pickle it to .pkl"
        )


SAFE_MODE_FIX = "pass --no-safe-mode (tbs.profile(..., safe_mode=False)) if you trust this file"


def _load_error(path: Path, exc: BaseException) -> ModelLoadError:
    """The one-line error for a failed load: a missing class, safe mode, a corrupt file, or else the cause."""
    missing = _missing_name(exc)
    if missing:
        return ModelLoadError(
            f"model '{path}' needs '{missing}', which is not defined here; "
            f"pass --custom-objects FILE.py with the code that defines it"
        )
    if "safe_mode" in str(exc):  # Keras's advice is 'pass safe_mode=False to the loading function'
        return ModelLoadError(
            f"model '{path}' contains a Lambda layer (arbitrary Python code), which Keras's safe mode "
            f"refuses to load; {SAFE_MODE_FIX}"
        )
    if "No model config found" in str(exc):  # a .weights.h5 file, or an .h5 of model.save_weights
        return ModelLoadError(f"'{path}' holds only weights, not the model; {SAVE_AS_KERAS}")
    if (isinstance(exc, (pickle.UnpicklingError, EOFError)) or "zip" in str(exc).lower()
            or "file signature not found" in str(exc) or "truncated file" in str(exc)):  # zip or HDF5
        return ModelLoadError(f"model file '{path}' is corrupt or truncated ({_first_line(exc)}); re-save the model")
    return ModelLoadError(f"cannot load model '{path}': {_first_line(exc)}")


def _check_model(model: Any, where: str | None = None) -> None:
    """A usable model is a built keras.Model; ``where`` is its file (None: an object passed in memory)."""
    keras = _keras()
    if not isinstance(model, keras.Model):
        what = "a Keras layer" if isinstance(model, keras.layers.Layer) else f"a {type(model).__module__}.{type(model).__name__}"
        if where:
            raise ModelLoadError(f"'{where}' holds {what}, not a Keras model; pickle or save a keras.Model")
        raise ModelLoadError(f"the model passed in is {what}, not a Keras model; pass a keras.Model or a model file")
    if not model.built:
        fix = "before saving" if where else "first"
        subject = f"model in '{where}'" if where else "the model passed in"
        raise ModelLoadError(f"{subject} was never built; call it once on data (or build it) {fix}")


# Keras restores a compiled model's optimizer variables only when the optimizer was built before saving;
# tbs times fresh optimizers, so the warning says nothing the user needs.
_OPTIMIZER_WARNING = "Skipping variable loading for optimizer"


def load_model(path: Path, custom_objects: dict[str, Any] | None = None,
               scope: Callable[[], ContextManager] = nullcontext, safe_mode: bool = True,
               compile: bool = False) -> LoadedModel:
    """Load and validate a model file; every failure becomes a one-line ModelLoadError.

    ``safe_mode`` is Keras's: off, a .keras or .h5 file may run the code it holds (Lambda layers).
    A pickle runs code whatever it says: the user chose to load it. ``compile`` (training)
    restores a .keras or .h5 file's own compile() -- its loss and optimizer, as Keras's ``load_model``
    does -- and where that fails (a loss nobody defined here) loads it uncompiled and says why
    in ``compile_note``, so the profile runs with stand-ins instead of refusing the model.
    """
    path = Path(path)
    check_model_file(path)
    keras = _keras()
    custom_objects = custom_objects or {}
    suffix = path.suffix.lower()
    note = ""
    try:
        with scope(), keras.saving.custom_object_scope(custom_objects), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_OPTIMIZER_WARNING)
            if suffix in PICKLE_SUFFIXES:
                import cloudpickle  # noqa: F401  (registers reducers cloudpickle-made files may need)

                with open(path, "rb") as f:
                    model = pickle.load(f)
                fmt = "pickle"
            else:
                model, note = _load_keras(path, custom_objects, safe_mode, compile)
                fmt = "h5" if suffix in H5_SUFFIXES else "keras"
    except Exception as exc:
        raise _load_error(path, exc) from None
    _check_model(model, str(path))
    return LoadedModel(model=model, path=path, name=path.stem, sha256=_file_sha256(path), format=fmt,
                       compile_note=note)


def _load_keras(path: Path, custom_objects: dict[str, Any], safe_mode: bool, compile: bool) -> tuple[Any, str]:
    """A .keras or .h5 model, compiled as saved when asked; uncompiled with the reason when its compile() fails."""
    keras = _keras()
    if compile:
        try:
            return keras.saving.load_model(path, custom_objects=custom_objects, compile=True, safe_mode=safe_mode), ""
        except Exception as exc:
            failed = exc
    model = keras.saving.load_model(path, custom_objects=custom_objects, compile=False, safe_mode=safe_mode)
    if not compile:
        return model, ""
    missing = _missing_name(failed)
    # Keras 3 cannot read every compile() a Keras 2-era .h5 holds (a loss saved by name): no code is missing.
    advice = "" if path.suffix.lower() in H5_SUFFIXES else "; pass --custom-objects with the code it needs"
    why = (f"it needs '{missing}', which is not defined here; pass --custom-objects FILE.py defining it"
           if missing else f"{_first_line(failed)[:160]}{advice}")
    return model, (f"the model's own compile() could not be restored from '{path.name}': {why}, "
                   f"or choose --loss and --optimizer")


IN_MEMORY_FORMAT = "in-memory"


@dataclass(frozen=True)
class ModelSource:
    """An in-memory model pickled once: every device's copy is unpickled from the same bytes.

    It keeps no reference to the model, so caching it per model does not keep the model alive.
    """

    name: str
    data: bytes
    sha256: str  # of the model's name, layer classes and weights (stable across processes)
    # The model's own layer classes, and the functions and classes its compile() names, for Keras's loader.
    classes: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, model: Any) -> "ModelSource":
        """Pickle a built keras.Model in memory (Keras saves it to a byte buffer, never to a file)."""
        import cloudpickle

        _check_model(model)
        try:
            data = cloudpickle.dumps(model)
        except Exception as exc:
            raise ModelLoadError(f"cannot copy the in-memory model '{model.name}': {_first_line(exc)}; "
                                 f"save it (model.save('m.keras')) and profile the file") from None
        classes = _model_classes(model)
        # Pickled bytes carry save timestamps; the model's identity is its layers and weights,
        # so a new process profiling the same model can --resume its profile.
        identity = hashlib.sha256(f"{model.name}|{[name for name, _ in classes]}|{_weights_digest(model)}".encode())
        return cls(name=str(model.name), data=data, sha256=identity.hexdigest(),
                   classes=classes + compile_objects(model))

    def copy(self, scope: Callable[[], ContextManager] = nullcontext) -> Any:
        """A new, independent model from the bytes, its variables made under ``scope()``."""
        import cloudpickle

        keras = _keras()
        try:
            with scope(), keras.saving.custom_object_scope(dict(self.classes)), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_OPTIMIZER_WARNING)
                return cloudpickle.loads(self.data)
        except Exception as exc:
            raise ModelLoadError(f"cannot copy the in-memory model '{self.name}': {_first_line(exc)}; "
                                 f"save it (model.save('m.keras')) and profile the file") from None


def _model_classes(model: Any) -> tuple[tuple[str, type], ...]:
    """Classes of the model and its layers by name: Keras's loader finds unregistered custom classes by them."""
    try:
        layers = list(model._flatten_layers(include_self=True, recursive=True))
    except Exception:  # pragma: no cover - very old/odd models
        layers = [model, *getattr(model, "layers", [])]
    found: dict[str, type] = {}
    for layer in layers:
        found.setdefault(type(layer).__name__, type(layer))
    return tuple(found.items())


def compile_objects(model: Any) -> tuple[tuple[str, Any], ...]:
    """The functions and classes a compiled model's compile() names (a custom loss or metric), by name.

    A copy is unpickled through Keras's loader, which restores the compile() too: an unregistered
    loss function defined in the user's script must be offered to it, or the copy fails.
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(config, dict):
        return ()
    found: dict[str, Any] = {}
    for value in _keras().tree.flatten(list(config.values())):
        if inspect.isfunction(value):
            found.setdefault(value.__name__, value)
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            found.setdefault(type(value).__name__, type(value))
    return tuple(found.items())


def _weights_digest(model: Any) -> str:
    """Fingerprint of the model's current weights: a model trained since it was pickled is pickled again."""
    digest = hashlib.sha256()
    for variable in model.weights:
        value = np.asarray(variable)
        digest.update(f"{variable.path}:{value.dtype}:{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def load_model_object(model: Any, scope: Callable[[], ContextManager] = nullcontext) -> LoadedModel:
    """An independent copy of an in-memory keras.Model (or a ModelSource) made under ``scope()``.

    The caller's model is never placed or changed. Pass one ``ModelSource.of(model)`` for
    every device's copy: the model is then pickled (and its weights hashed) once.
    """
    source = model if isinstance(model, ModelSource) else ModelSource.of(model)
    copy = source.copy(scope)
    return LoadedModel(model=copy, path=None, name=source.name, sha256=source.sha256, format=IN_MEMORY_FORMAT)
