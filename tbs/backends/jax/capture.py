"""JAX during the eager capture: string inputs that JAX cannot hold pass through Keras untouched."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from tbs.backends.tensors import is_host_strings


@contextmanager
def host_strings_accepted() -> Iterator[None]:
    """Let a Functional model take NumPy string inputs on a backend without strings (JAX).

    Keras converts every model input to its declared dtype first, which fails for
    ``string`` on JAX although the string layers themselves (TextVectorization,
    which runs TensorFlow ops) accept NumPy strings. For the eager capture only,
    string inputs skip that conversion; the rest convert as Keras would.
    """
    from keras.src.models.functional import Functional

    import keras
    original = Functional._convert_inputs_to_tensors

    def convert(self: Any, flat_inputs: list[Any]) -> list[Any]:
        if not any(is_host_strings(x) for x in flat_inputs):
            return original(self, flat_inputs)
        return [x if x is None or is_host_strings(x) else keras.ops.convert_to_tensor(x, dtype=spec.dtype)
                for x, spec in zip(flat_inputs, self._inputs)]

    Functional._convert_inputs_to_tensors = convert
    try:
        yield
    finally:
        Functional._convert_inputs_to_tensors = original
