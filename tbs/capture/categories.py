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
    "activation",
    "merge",
    "reshape",
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
    ("activations", "activation"),
    ("merging", "merge"),
    ("reshaping", "reshape"),
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
    ("relu", "activation"),
    ("gelu", "activation"),
    ("activation", "activation"),
    ("softmax", "activation"),
)

# Keras's activation, merge and reshape classes, by name: profiles written before these kinds existed
# recorded them as "other", and the report reads a layer's kind from its recorded type and category.
_KERAS_CLASS_KIND = {
    **dict.fromkeys(("Activation", "ReLU", "LeakyReLU", "PReLU", "ELU", "Softmax"), "activation"),
    **dict.fromkeys(("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot"),
                    "merge"),
    **dict.fromkeys(("Flatten", "Reshape", "Permute", "RepeatVector", "ZeroPadding1D", "ZeroPadding2D",
                     "ZeroPadding3D", "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D",
                     "UpSampling3D"), "reshape"),
}


def categorize(cls: type) -> str:
    """Category of a layer class: one of CATEGORIES ('other' for dropout, identity, lambda...)."""
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


def kind_of(layer_type: str, category: str) -> str:
    """The kind the report groups a recorded layer under: its category, with a Keras activation, merge or
    reshape class that an older profile recorded as 'other' moved to its own kind."""
    if category == "other":
        return _KERAS_CLASS_KIND.get(layer_type, category)
    return category if category in CATEGORIES else "other"
