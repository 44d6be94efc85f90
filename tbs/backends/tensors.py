"""Backend-neutral views of the data flowing through a model: which values are tensors, their sizes.

Nested structures are walked with ``keras.tree`` (what Keras itself uses on every
backend), so the same code reads TensorFlow tensors and JAX arrays. A NumPy
array of strings also counts as data: JAX has no string type, so string inputs
stay on the host as NumPy arrays.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _keras() -> Any:
    """Keras, already imported with the chosen backend by ``tbs.backends.keras()`` (these helpers run later)."""
    import keras

    return keras



def is_host_strings(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OSU"


def is_tensor(x: Any) -> bool:
    """A value that is data (dense, ragged or sparse tensor, device array), not a Python setting."""
    return is_host_strings(x) or _keras().ops.is_tensor(x)


def flatten(structure: Any) -> list[Any]:
    return _keras().tree.flatten(structure)


def pack(structure: Any, flat: list[Any]) -> Any:
    return _keras().tree.pack_sequence_as(structure, flat)


def iter_tensors(structure: Any) -> list[Any]:
    """The tensors in a nested structure (Python settings such as training=False left out)."""
    return [x for x in flatten(structure) if is_tensor(x)]


def replace_tensors(structure: Any, tensors: list[Any]) -> Any:
    """``structure`` with its tensors (in ``iter_tensors`` order) replaced by ``tensors``."""
    it = iter(tensors)
    return pack(structure, [next(it) if is_tensor(x) else x for x in flatten(structure)])


def tensor_shape(x: Any) -> list[int | None]:
    shape = getattr(x, "shape", None)
    if shape is None:
        return []
    return [None if d is None else int(d) for d in shape]


def dtype_name(x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    return getattr(dtype, "name", str(dtype or ""))


def tensor_bytes(x: Any) -> int:
    """Bytes a tensor occupies (string tensors: their characters)."""
    if is_host_strings(x):
        return int(sum(len(s) for s in x.ravel()))
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(x, (tf.RaggedTensor, tf.SparseTensor, tf.Tensor, tf.Variable)):
        if isinstance(x, tf.RaggedTensor):
            return tensor_bytes(x.flat_values) + tensor_bytes(x.row_splits)
        if isinstance(x, tf.SparseTensor):
            return tensor_bytes(x.values) + tensor_bytes(x.indices)
        if x.dtype == tf.string:
            return int(tf.reduce_sum(tf.strings.length(x)).numpy())
    itemsize = np.dtype(getattr(x.dtype, "as_numpy_dtype", x.dtype)).itemsize
    return int(np.prod(tensor_shape(x) or [1], dtype=np.int64)) * itemsize


def fresh_if_passed_through(outputs: Any, inputs: list[Any]) -> Any:
    """An output that *is* an input (Dropout or RandomFlip in inference) gets a new handle.

    Tensors are told apart by identity; without this, the pass-through layer would
    take over its input's producer and the graph would lose an edge. On TensorFlow
    the copy is ``tf.identity`` (the buffer is shared); the mask travels along.
    """
    keras = _keras()
    from keras.src.backend.common.masking import get_keras_mask, set_keras_mask

    seen = {id(x) for x in inputs}

    def fresh(x: Any) -> Any:
        if id(x) not in seen or not keras.ops.is_tensor(x):
            return x
        y = keras.ops.copy(x)
        mask = get_keras_mask(x)
        if mask is not None:
            set_keras_mask(y, mask)
        return y

    return keras.tree.map_structure(fresh, outputs)
