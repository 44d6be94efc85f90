"""What a training profile trains with: the loss, the optimizer and synthetic targets.

The model's own ``compile()`` loss and optimizer are used when it has them, since
they are what its real training runs. Otherwise tbs stands in with Adam and a loss
that fits the output: sparse categorical cross-entropy for class scores (a last
axis of two or more), mean squared error for regression-shaped outputs. Either
can be chosen (``--loss``, ``--optimizer``); every choice is recorded with its
source in the profile's metadata. Targets are synthetic, seeded, and shaped as the
loss expects (class ids, one-hot rows, 0/1 labels or real values).

A loss given by name or as a function (``compile(loss="mse")``, a custom function) is
per-sample: Keras's ``compile()`` wraps it to reduce over the batch, and so does tbs;
``compile(loss_weights=...)`` weighs each output's loss as ``fit`` does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from tbs.backends import keras as _keras
from tbs.backends.tensors import dtype_name
from tbs.errors import TbsError

STAND_IN_OPTIMIZER = "adam"
CLASS_LOSSES = ("SparseCategoricalCrossentropy", "sparse_categorical_crossentropy")
ONE_HOT_LOSSES = ("CategoricalCrossentropy", "categorical_crossentropy", "CategoricalFocalCrossentropy",
                  "categorical_focal_crossentropy", "KLDivergence", "kl_divergence", "Poisson", "poisson")
BINARY_LOSSES = ("BinaryCrossentropy", "binary_crossentropy", "BinaryFocalCrossentropy",
                 "binary_focal_crossentropy", "Hinge", "hinge", "SquaredHinge", "squared_hinge")
# Names Keras's compile() resolves from the labels and outputs (binary, sparse or one-hot cross-entropy).
CROSSENTROPY_ALIASES = ("crossentropy", "ce")
WRAPPER = "LossFunctionWrapper"


def _name(loss: Any) -> str:
    """A loss's name as Keras spells its class or, for a wrapped function, the function."""
    if type(loss).__name__ == WRAPPER:
        return getattr(loss.fn, "__name__", loss.name)
    return type(loss).__name__ if isinstance(loss, _keras().losses.Loss) else getattr(loss, "__name__", str(loss))


def _wrapped(loss: Any, name: str) -> Any:
    """A per-sample loss function reduced over the batch as ``compile()`` reduces it; a Loss object as it is."""
    if isinstance(loss, _keras().losses.Loss):
        return loss
    from keras.src.losses import LossFunctionWrapper  # what compile() wraps functions in (not exported)

    return LossFunctionWrapper(loss, name=name)


@dataclass
class TrainingSetup:
    """The loss and optimizer a training profile times, and where each came from."""

    losses: list[Any]  # one Keras loss per model output
    loss_source: str  # "model.compile" | "stand-in" | "--loss"
    optimizer_config: dict[str, Any]  # keras.optimizers.serialize() of the optimizer
    optimizer_source: str
    note: str = ""  # why the model's own compile() is not what is used (it could not be restored), if so
    weights: list[float] | None = None  # compile(loss_weights=...): each output's loss is scaled by its weight

    @property
    def loss_name(self) -> str:
        names = list(dict.fromkeys(_name(l) for l in self.losses))
        return "+".join(names)

    @property
    def optimizer_name(self) -> str:
        return str(self.optimizer_config.get("class_name", "?"))

    def make_optimizer(self) -> Any:
        """A fresh, unbuilt optimizer (one per timed program, so no two share slots)."""
        return _keras().optimizers.deserialize(copy.deepcopy(self.optimizer_config))  # it edits what it is given

    def loss(self, targets: list[Any], outputs: Any) -> Any:
        """The scalar loss of the model's (flat) outputs against their targets."""
        flat = _keras().tree.flatten(outputs)
        ops = _keras().ops
        total = None
        for i, (loss, target, output) in enumerate(zip(self.losses, targets, flat)):
            value = loss(target, output)
            if self.weights is not None:  # as compile() does: the value in float32, times its weight
                value = ops.multiply(ops.cast(value, "float32"), self.weights[i])
            total = value if total is None else total + value
        return total

    def targets(self, outputs: Any, batch_size: int, seed: int) -> list[np.ndarray]:
        """Synthetic targets for each output, shaped and typed as its loss expects."""
        rng = np.random.default_rng([seed, batch_size, 7])
        return [_target(loss, tuple(np.shape(out)), rng) for loss, out in zip(self.losses, _keras().tree.flatten(outputs))]

    def targets_description(self, seed: int) -> str:
        return f"synthetic (seed {seed}): shaped for {self.loss_name}"

    def as_dict(self, seed: int) -> dict[str, Any]:
        keras = _keras()
        return {"loss": {"name": self.loss_name, "source": self.loss_source,
                         "serialized": [keras.losses.serialize(l) for l in self.losses],
                         **({"weights": self.weights} if self.weights is not None else {})},
                "optimizer": {"name": self.optimizer_name, "config": self.optimizer_config.get("config", {}),
                              "source": self.optimizer_source, "serialized": self.optimizer_config},
                "targets": self.targets_description(seed), **({"note": self.note} if self.note else {})}

    @classmethod
    def from_metadata(cls, training: dict[str, Any], custom_objects: dict[str, Any] | None = None) -> "TrainingSetup":
        """The loss and optimizer a training profile was measured with (``--verify`` replays them).

        ``custom_objects`` define what they name that Keras does not know (a custom loss function).
        """
        keras = _keras()
        loss, optimizer = training.get("loss") or {}, training.get("optimizer") or {}
        if "serialized" not in loss or "serialized" not in optimizer:
            raise TbsError("this training profile does not record its loss and optimizer in full "
                           "(measured by an older tbs); profile it again to verify it")
        with keras.saving.custom_object_scope(custom_objects or {}):
            losses = [keras.losses.deserialize(copy.deepcopy(l)) for l in loss["serialized"]]
        for made in losses:  # Keras resolves a wrapper's name into the function of that name: a name again
            made.name = made.name if isinstance(made.name, str) else _name(made)
        return cls(losses, loss.get("source", ""),
                   optimizer["serialized"], optimizer.get("source", ""), training.get("note", ""),
                   loss.get("weights"))


def _target(loss: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    name = _name(loss)
    if name in CLASS_LOSSES:
        classes = shape[-1] if len(shape) >= 2 else 2
        return rng.integers(0, classes, size=shape[:-1]).astype(np.int32)
    if name in ONE_HOT_LOSSES:
        classes = shape[-1] if len(shape) >= 2 else 1
        ids = rng.integers(0, classes, size=shape[:-1])
        return np.eye(classes, dtype=np.float32)[ids]
    if name in BINARY_LOSSES:
        return rng.integers(0, 2, size=shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def _stand_in_loss(output: Any) -> Any:
    """Class scores (last axis >= 2) -> sparse categorical cross-entropy; else mean squared error."""
    keras = _keras()
    shape = tuple(output.shape)
    if len(shape) >= 2 and (shape[-1] or 0) >= 2:
        activation = getattr(getattr(output, "_keras_history", None), "operation", None)
        from_logits = getattr(getattr(activation, "activation", None), "__name__", "") != "softmax"
        return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
    return keras.losses.MeanSquaredError()


def _crossentropy_for(output: Any) -> str:
    """Keras's choice for ``loss="crossentropy"``: binary for one output unit, else sparse (tbs's labels are ids)."""
    shape = tuple(getattr(output, "shape", ()) or ())
    return "binary_crossentropy" if shape and shape[-1] == 1 else "sparse_categorical_crossentropy"


def _get_loss(spec: Any, where: str, output: Any = None) -> Any:
    """The Keras loss a name, function or Loss names, reduced over the batch as compile() reduces it."""
    keras = _keras()
    if isinstance(spec, str) and spec.lower() in CROSSENTROPY_ALIASES:
        spec = _crossentropy_for(output)
    try:
        loss = keras.losses.get(spec)
    except (ValueError, TypeError):
        loss = None
    if loss is None:
        raise TbsError(f"{where}: unknown loss '{spec}'; give a Keras loss name such as mse, "
                       f"sparse_categorical_crossentropy or binary_crossentropy")
    return _wrapped(loss, spec if isinstance(spec, str) else getattr(loss, "__name__", _name(loss)))


def _compiled_losses(model: Any, outputs: list[Any]) -> list[Any] | None:
    compiled = getattr(model, "loss", None)
    if compiled is None or not getattr(model, "compiled", False):
        return None
    where = "the model's compiled loss"
    if isinstance(compiled, dict):
        names = list(getattr(model, "output_names", []) or [])
        if len(names) != len(outputs) or any(n not in compiled for n in names):
            raise TbsError("the model's compiled loss is a dict that does not name every output; "
                           "pass --loss to choose one loss for every output")
        return [_get_loss(compiled[n], where, out) for n, out in zip(names, outputs)]
    if isinstance(compiled, (list, tuple)):
        if len(compiled) != len(outputs):
            raise TbsError(f"the model's compiled loss lists {len(compiled)} losses for {len(outputs)} outputs; "
                           "pass --loss to choose one")
        return [_get_loss(c, where, out) for c, out in zip(compiled, outputs)]
    return [_get_loss(compiled, where, out) for out in outputs] or [_get_loss(compiled, where)]


def _compiled_weights(model: Any, count: int) -> list[float] | None:
    """``compile(loss_weights=...)`` as one weight per output (a dict by output name); None when not given."""
    try:
        weights = (model.get_compile_config() or {}).get("loss_weights")
    except Exception:  # a model whose compile config cannot be read: no weights to honour
        return None
    if weights is None:
        return None
    if isinstance(weights, dict):
        names = list(getattr(model, "output_names", []) or [])
        weights = [weights.get(n, 1.0) for n in names]
    elif not isinstance(weights, (list, tuple)):
        weights = [weights] * count
    if len(weights) != count:
        raise TbsError(f"the model's compiled loss_weights list {len(weights)} weights for {count} outputs; "
                       "pass --loss to choose one loss for every output")
    return [float(w) for w in weights]


def _serialized(optimizer: Any) -> dict[str, Any]:
    """The optimizer's config without its instance name (Keras numbers them: adam, adam_1, ...)."""
    config = _keras().optimizers.serialize(optimizer)
    config.get("config", {}).pop("name", None)
    config["class_name"] = type(optimizer).__name__  # serialize() gives "adam" or "Adam" depending on history
    return config


def _optimizer(model: Any, optimizer: str | None) -> tuple[dict[str, Any], str]:
    keras = _keras()
    if optimizer is not None:
        try:
            built = keras.optimizers.get(optimizer)
        except (ValueError, TypeError):
            raise TbsError(f"--optimizer: unknown optimizer '{optimizer}'; give a Keras optimizer name such as "
                           "adam, sgd, rmsprop or adamw") from None
        return _serialized(built), "--optimizer"
    compiled = getattr(model, "optimizer", None)
    if compiled is not None and getattr(model, "compiled", False):
        return _serialized(compiled), "model.compile"
    return _serialized(keras.optimizers.get(STAND_IN_OPTIMIZER)), "stand-in"


def resolve(model: Any, loss: str | None = None, optimizer: str | None = None, compile_note: str = "",
            outputs: Any = None) -> TrainingSetup:
    """The loss and optimizer to time: chosen, the model's compiled ones, or the documented stand-ins.

    ``outputs`` are the model's outputs where it declares none (a subclassed model: one call
    shows them). ``compile_note`` says why a saved model's own compile() could not be restored:
    it travels with the setup wherever a stand-in took the place of what the model compiled.
    """
    keras = _keras()
    outputs = keras.tree.flatten(outputs if outputs is not None else getattr(model, "outputs", None) or [])
    weights = None
    if loss is not None:
        losses = [_get_loss(loss, "--loss", out) for out in outputs] or [_get_loss(loss, "--loss")]
        loss_source = "--loss"
    else:
        compiled = _compiled_losses(model, outputs)
        if compiled is not None:
            losses, loss_source = compiled, "model.compile"
            weights = _compiled_weights(model, len(compiled))
        elif outputs:
            losses, loss_source = [_stand_in_loss(o) for o in outputs], "stand-in"
        else:  # outputs unknown: fit_to_outputs chooses
            losses, loss_source = [], "stand-in"
    config, optimizer_source = _optimizer(model, optimizer)
    stand_in = "stand-in" in (loss_source, optimizer_source)
    return TrainingSetup(losses, loss_source, config, optimizer_source, compile_note if stand_in else "", weights)


def fit_to_outputs(setup: TrainingSetup, outputs: Any) -> None:
    """Check (and, for a subclassed model, choose) the losses against the real outputs of one forward pass."""
    flat = _keras().tree.flatten(outputs)
    if not setup.losses:
        setup.losses = [_stand_in_loss(o) for o in flat]
    if len(setup.losses) != len(flat):
        setup.losses = [setup.losses[0]] * len(flat)
    for out in flat:
        if dtype_name(out) not in ("float16", "bfloat16", "float32", "float64"):
            raise TbsError(f"the model's output has dtype {out.dtype}: a loss needs floating-point outputs to train")
    where = "--loss" if setup.loss_source == "--loss" else f"the {setup.loss_source} loss"
    for loss, out in zip(setup.losses, flat):
        classes = np.shape(out)[-1] if np.ndim(out) >= 2 else 1
        if _name(loss) in CLASS_LOSSES + ONE_HOT_LOSSES[:4] and classes < 2:
            raise TbsError(f"{where} {_name(loss)} needs class scores (a last axis of 2 or more), and the model's "
                           f"output has shape {tuple(np.shape(out))}; choose a regression loss such as mse")
    targets = setup.targets(outputs, int(np.shape(flat[0])[0]) if flat and np.ndim(flat[0]) else 1, 0)
    try:
        value = setup.loss(targets, outputs)
        float(np.asarray(value))
    except Exception as exc:  # the loss cannot take this output: the user's choice does not fit
        shapes = ", ".join(str(tuple(np.shape(o))) for o in flat)
        raise TbsError(f"{where} {setup.loss_name} does not fit the model's output of shape {shapes} "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); choose a loss for that output") from None

