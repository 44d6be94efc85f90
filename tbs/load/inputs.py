"""Model inputs: synthetic batches from the model's input specs, or the user's data.

Synthetic data must be valid for the layers it feeds, or the timing is of an
error path: integers stay inside every Embedding's vocabulary, images are in
[0, 255] when the model rescales them, and text is made of words from the
TextVectorization vocabulary.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tbs.errors import InputDataError
from tbs.backends import keras as _keras

_FALLBACK_WORDS = (
    "the movie was a great and moving story with fine acting but the plot felt slow "
    "at times yet the music and camera work were beautiful and i would watch it again"
).split()


@dataclass
class InputSpec:
    """One model input: shape without the batch axis, dtype, and the values it may take."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    low: float = 0.0
    high: float = 1.0
    words: list[str] = field(default_factory=list)
    words_per_sample: int = 20
    integer_valued: bool = False
    keyed: bool = False  # the model takes a dict keyed by name (known only from --input data)

    def concrete_shape(self, batch_size: int) -> tuple[int, ...]:
        """The batch shape with unknown dims filled in: 224 for image height/width, else 16."""
        image_like = len(self.shape) == 3 and self.shape[-1] in (1, 3, 4)
        dims = [(DEFAULT_SPATIAL if image_like and i < 2 else DEFAULT_LENGTH) if d is None else d
                for i, d in enumerate(self.shape)]
        return (batch_size, *dims)

    @property
    def has_unknown_dims(self) -> bool:
        return any(d is None for d in self.shape)

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"'{self.name}' (batch, {dims}) {self.dtype}"


def _all_layers(model: Any) -> list[Any]:
    try:
        return list(model._flatten_layers(include_self=False, recursive=True))
    except Exception:  # pragma: no cover - very old/odd models
        return list(getattr(model, "layers", []))


INTEGER_CONSUMERS = ("Embedding", "CategoryEncoding", "IntegerLookup")
DEFAULT_SPATIAL = 224  # unknown image height/width (keras.applications' usual size)
DEFAULT_LENGTH = 16  # other unknown dimensions


def _integer_low(layers: list[Any]) -> int:
    """1 when an Embedding masks zeros: a 0 mid-sequence breaks cuDNN RNNs' mask checks."""
    return 1 if any(type(l).__name__ == "Embedding" and getattr(l, "mask_zero", False) for l in layers) else 0


def _integer_limit(layers: list[Any]) -> int:
    """Largest exclusive upper bound valid for every integer-consuming layer."""
    limits = []
    for layer in layers:
        kind = type(layer).__name__
        if kind == "Embedding":
            limits.append(int(layer.input_dim))
        elif kind == "CategoryEncoding":
            limits.append(int(layer.num_tokens))
        elif kind == "IntegerLookup":
            limits.append(max(int(layer.vocabulary_size()), 1))
    return min(limits) if limits else 10


def _text_source(layers: list[Any]) -> tuple[list[str], int]:
    for layer in layers:
        if type(layer).__name__ in ("TextVectorization", "StringLookup"):
            try:
                vocab = [w for w in layer.get_vocabulary() if w and w != "[UNK]"]
            except Exception:
                vocab = []
            length = getattr(layer, "_output_sequence_length", None) or 20
            words = [str(w) for w in vocab] or list(_FALLBACK_WORDS)
            per_sample = 1 if type(layer).__name__ == "StringLookup" else int(length)
            return words, per_sample
    return list(_FALLBACK_WORDS), 20


def _float_high(layers: list[Any]) -> float:
    for layer in layers:
        if type(layer).__name__ == "Rescaling":
            scale = np.asarray(layer.scale, dtype=float)
            if scale.size and float(np.max(np.abs(scale))) <= 1.0 / 100:
                return 255.0
    return 1.0


def _first_leaf_dtype(layers: list[Any]) -> str:
    keras = _keras()
    for layer in layers:
        if isinstance(layer, keras.Model):
            continue
        kind = type(layer).__name__
        if kind in ("TextVectorization", "StringLookup", "Hashing"):
            return "string"
        if kind in ("Embedding", "IntegerLookup", "CategoryEncoding"):
            return "int32"
        return "float32"
    return "float32"


def _downstream_layers(model: Any, tensor: Any) -> list[Any] | None:
    """Layers a Functional model's input flows into (nested models expanded); None if unknown."""
    keras = _keras()
    graph = getattr(model, "_functional", None) or model  # a built Sequential keeps its graph inside
    try:
        operations = list(graph.operations)
    except Exception:
        return None
    frontier = {id(tensor)}
    found: list[Any] = []
    changed = True
    while changed:
        changed = False
        for op in operations:
            if any(op is f for f in found):
                continue
            for node in getattr(op, "_inbound_nodes", []):
                if any(id(t) in frontier for t in node.input_tensors):
                    found.append(op)
                    frontier.update(id(t) for t in node.output_tensors)
                    changed = True
                    break
    layers: list[Any] = []
    for op in found:
        layers.append(op)
        if isinstance(op, keras.Model):
            layers.extend(_all_layers(op))
    return layers


def input_specs(model: Any) -> list[InputSpec]:
    """Specs for each model input, from its Input tensors or, failing that, its build shapes."""
    layers = _all_layers(model)
    raw: list[tuple[str, tuple, str]] = []
    try:
        model_inputs = model.inputs
    except (AttributeError, ValueError):
        model_inputs = None
    if model_inputs:
        for i, tensor in enumerate(model_inputs):
            dtype = getattr(tensor.dtype, "name", str(tensor.dtype))
            raw.append((getattr(tensor, "name", f"input_{i}"), tuple(tensor.shape)[1:], dtype))
    else:
        shape = None
        shapes = getattr(model, "_build_shapes_dict", None)
        if shapes and len(shapes) == 1:
            shape = next(iter(shapes.values()))
        # nested build shapes (several inputs of a subclassed model) cannot be guessed: --input
        if not isinstance(shape, (tuple, list)) or not all(d is None or isinstance(d, int) for d in shape):
            return []
        raw.append(("input", tuple(shape)[1:], _first_leaf_dtype(layers)))
    specs = []
    for index, (name, shape, dtype) in enumerate(raw):
        fed = _downstream_layers(model, model_inputs[index]) if model_inputs else None
        fed = layers if fed is None else fed
        words, per_sample = _text_source(fed)
        int_high, float_high = _integer_limit(fed), _float_high(fed)
        spec = InputSpec(name=name, shape=tuple(None if d is None else int(d) for d in shape), dtype=dtype)
        first = next((l for l in fed if not isinstance(l, (_keras().Model, _keras().layers.InputLayer))), None)
        feeds_integers = type(first).__name__ in INTEGER_CONSUMERS
        if dtype.startswith("int") or dtype.startswith("uint") or (feeds_integers and dtype.startswith("float")):
            # indices, also when declared float (Sequential.build((None, 300)) before an Embedding)
            spec.integer_valued = True
            spec.low, spec.high = float(_integer_low(fed)), float(int_high)
        elif dtype in ("string", "str", "object"):
            spec.words, spec.words_per_sample = words, per_sample
        elif dtype == "bool":
            spec.integer_valued, spec.high = True, 2.0
        else:
            spec.high = float_high
        specs.append(spec)
    return specs


def synthetic_batch(specs: list[InputSpec], batch_size: int, seed: int = 0) -> list[np.ndarray]:
    """One batch per spec (unknown dims filled in, see InputSpec.concrete_shape)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        shape = spec.concrete_shape(batch_size)
        if spec.dtype in ("string", "str", "object"):
            words = np.asarray(spec.words, dtype=object)
            count = int(np.prod(shape))
            lengths = rng.integers(max(1, spec.words_per_sample // 2), spec.words_per_sample * 2 + 1, size=count)
            if spec.words_per_sample == 1:
                lengths = np.ones(count, dtype=int)
            texts = [" ".join(rng.choice(words, size=int(n))) for n in lengths]
            arrays.append(np.asarray(texts, dtype=object).reshape(shape))
        elif spec.integer_valued or spec.dtype == "bool":
            arrays.append(rng.integers(int(spec.low), int(spec.high), size=shape).astype(spec.dtype))
        else:
            values = rng.uniform(spec.low, spec.high, size=shape)
            arrays.append(values.astype(spec.dtype))
    return arrays


def _as_arrays(data: Any, specs: list[InputSpec], source: str) -> list[np.ndarray]:
    """One array per spec, in the specs' order.

    A dict feeds a model of several inputs by name only: its order says nothing about which
    input an array is for, so a guess could feed arrays to the wrong inputs. A model of one
    input takes a dict of one array under any key.
    """
    if isinstance(data, dict):
        names = [s.name for s in specs]
        if all(n in data for n in names):
            return [np.asarray(data[n]) for n in names]
        if len(specs) > 1:
            given = ", ".join(repr(k) for k in data) or "none"
            raise InputDataError(
                f"{source}: arrays named {given} do not match the model's inputs "
                f"{', '.join(repr(n) for n in names)}; key each array by the name of the input it feeds"
            )
        values = list(data.values())
    elif isinstance(data, (list, tuple)):
        values = list(data)
    else:
        values = [data]
    if len(values) != len(specs):
        expected = ", ".join(s.describe() for s in specs)
        raise InputDataError(
            f"{source}: holds {len(values)} array(s) but the model takes {len(specs)}: {expected}"
        )
    return [np.asarray(v) for v in values]


PICKLE_INPUT_SUFFIXES = (".pkl", ".pickle")


def _object_array_error(path: Path) -> InputDataError:
    """Pickle stays off for .npy/.npz (a data file must not run code), so say how to re-save instead."""
    return InputDataError(
        f"--input: '{path}' holds an object array, which needs pickle to load and .npy/.npz files load "
        f"with pickle off; save a numeric or string array (for text: np.save(path, array.astype(str))), "
        f"or pass a .pkl file (trusted code by nature)"
    )


def _read_numpy(path: Path, suffix: str) -> Any:
    """A .npy array, or a .npz as a dict by name (a list when numpy named them arr_0, arr_1, ...)."""
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)
    with np.load(path, allow_pickle=False) as npz:
        data = {k: npz[k] for k in npz.files}
    if data and all(k.startswith("arr_") for k in data):
        return [data[f"arr_{i}"] for i in range(len(data))]
    return data


def read_input_file(path: Path) -> Any:
    """The raw data of an --input file: an array, a list of arrays, or a dict of name -> array.

    .npy/.npz load with pickle off, so a data file cannot run code; a .pkl is code the user chose to run.
    """
    path = Path(path)
    if not path.is_file():
        raise InputDataError(f"--input: file '{path}' does not exist; pass a .npy, .npz or pickle file")
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz") + PICKLE_INPUT_SUFFIXES:
        raise InputDataError(f"--input: '{path}' has an unknown format '{suffix}'; use .npy, .npz or .pkl")
    try:
        if suffix in PICKLE_INPUT_SUFFIXES:
            with open(path, "rb") as f:
                return pickle.load(f)
        return _read_numpy(path, suffix)
    except ValueError as exc:
        if "allow_pickle" in str(exc) and suffix not in PICKLE_INPUT_SUFFIXES:
            raise _object_array_error(path) from None
        raise _unreadable(path, suffix, exc) from None
    except Exception as exc:
        raise _unreadable(path, suffix, exc) from None


def _unreadable(path: Path, suffix: str, exc: BaseException) -> InputDataError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return InputDataError(f"--input: cannot read '{path}' ({type(exc).__name__}: {text}); is it a valid {suffix} file?")


def _check_one(array: np.ndarray, spec: InputSpec, source: str) -> np.ndarray:
    """One array against one model input: its shape, then a cast to the input's dtype."""
    shape_ok = array.ndim == len(spec.shape) + 1 and all(
        want is None or want == got for want, got in zip(spec.shape, array.shape[1:])
    )
    if not shape_ok or array.shape[0] == 0:
        raise InputDataError(
            f"{source}: array of shape {tuple(array.shape)} does not fit model input "
            f"{spec.describe()}; give an array of shape (N, {', '.join('?' if d is None else str(d) for d in spec.shape)})"
        )
    if spec.dtype in ("string", "str", "object"):
        return array.astype(object)
    try:
        return array.astype(spec.dtype)
    except (TypeError, ValueError):
        raise InputDataError(
            f"{source}: data of dtype {array.dtype} cannot feed model input {spec.describe()}"
        ) from None


def check_input_arrays(data: Any, specs: list[InputSpec], source: str) -> list[np.ndarray]:
    """Check data (array, list of arrays, or dict by name) against the model's inputs, one array per spec.

    ``source`` starts each error ('--input data.npy', 'the input arrays'). A model that declares
    no inputs gets ``specs`` filled in from the data, so the caller's list is changed in place.
    """
    if not specs:
        specs[:] = specs_from_data(data)
    arrays = _as_arrays(data, specs, source)
    return [_check_one(array, spec, source) for array, spec in zip(arrays, specs)]


def load_user_input(path: Path, specs: list[InputSpec]) -> list[np.ndarray]:
    """Read an --input file (.npy/.npz with pickle off, or a trusted pickle) and check it against the model's inputs."""
    return check_input_arrays(read_input_file(path), specs, f"--input {path}")


def specs_from_data(data: Any) -> list[InputSpec]:
    """Specs for a model that declares no inputs (subclassed, several inputs): the data defines them."""
    if isinstance(data, dict):
        items, keyed = list(data.items()), True
    elif isinstance(data, (list, tuple)):
        items, keyed = [(f"input_{i}", v) for i, v in enumerate(data)], False
    else:
        items, keyed = [("input", data)], False
    specs = []
    for name, value in items:
        array = np.asarray(value)
        dtype = "string" if array.dtype.kind in "OSU" else array.dtype.name
        specs.append(InputSpec(name=str(name), shape=tuple(array.shape[1:]), dtype=dtype, keyed=keyed))
    return specs


def fit_to_batch(arrays: list[np.ndarray], batch_size: int) -> list[np.ndarray]:
    """Slice, or repeat, the user's samples to exactly batch_size rows."""
    fitted = []
    for array in arrays:
        repeats = -(-batch_size // array.shape[0])
        fitted.append(np.concatenate([array] * repeats, axis=0)[:batch_size] if repeats > 1 else array[:batch_size])
    return fitted


def batch_arrays(specs: list[InputSpec], batch_size: int, seed: int,
                 user_arrays: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """The data of one batch: the user's samples fitted to it, or synthetic data seeded per batch size."""
    if user_arrays is not None:
        return fit_to_batch(user_arrays, batch_size)
    return synthetic_batch(specs, batch_size, seed=seed + batch_size)


def structure_inputs(model: Any, arrays: list[Any], specs: list[InputSpec] | None = None) -> Any:
    """Arrange flat inputs the way the model's call expects them (single, list or dict)."""
    struct = getattr(model, "_inputs_struct", None)
    if struct is None and specs and all(s.keyed for s in specs):
        return {s.name: a for s, a in zip(specs, arrays)}
    if struct is None or len(arrays) == 1 and not isinstance(struct, (dict, list, tuple)):
        return arrays[0] if len(arrays) == 1 else list(arrays)
    return _keras().tree.pack_sequence_as(struct, list(arrays))
