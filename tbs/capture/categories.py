"""Group layer types the way the TBS paper does (preprocessing, embedding, dense, ...).

Keras organises its layers by package (keras.src.layers.<group>.<module>), so the
package path is the primary signal; class names are the fallback for custom layers.
"""

from __future__ import annotations

CATEGORIES = (
    "preprocessing",
    "embedding",
    "dense",
    "conv",
    "rnn",
    "pooling",
    "normalization",
    "attention",
    "other",
)

# Exact class names that the module path would misfile.
_BY_CLASS = {
    "Embedding": "embedding",
    "Dense": "dense",
    "EinsumDense": "dense",
    "TextVectorization": "preprocessing",
}

# Keras package segment -> category, checked in order.
_BY_MODULE = (
    ("preprocessing", "preprocessing"),
    ("convolutional", "conv"),
    ("rnn", "rnn"),
    ("pooling", "pooling"),
    ("normalization", "normalization"),
    ("attention", "attention"),
)

# Fallback for user layers: substrings of the class name.
_BY_NAME_PART = (
    ("embed", "embedding"),
    ("vectoriz", "preprocessing"),
    ("random", "preprocessing"),
    ("rescal", "preprocessing"),
    ("attention", "attention"),
    ("lstm", "rnn"),
    ("gru", "rnn"),
    ("rnn", "rnn"),
    ("conv", "conv"),
    ("pool", "pooling"),
    ("norm", "normalization"),
    ("dense", "dense"),
    ("linear", "dense"),
)


def categorize(cls: type) -> str:
    """Category of a layer class: one of CATEGORIES ('other' for reshape, merge, activation...)."""
    name = cls.__name__
    if name in _BY_CLASS:
        return _BY_CLASS[name]
    module = getattr(cls, "__module__", "") or ""
    if module.startswith("keras."):
        parts = module.split(".")
        for segment, category in _BY_MODULE:
            if segment in parts:
                return category
        return "other"
    lowered = name.lower()
    for part, category in _BY_NAME_PART:
        if part in lowered:
            return category
    return "other"
