"""What a training profile trains with: the model's own compile() -- its loss, loss weights and optimizer.

Models are compiled and saved the usual ways (a registered custom loss, string and function
losses, an SGD with Nesterov momentum); the profile must time what ``model.fit`` would run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import FAST
from keras_models import keras, layers

import tbs
from tbs.cli import cli
from tbs.load.train_setup import fit_to_outputs, resolve

FAST_TIMING = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
UNREGISTERED_LOSS = '''
import keras


def half_squared_error(y_true, y_pred):
    return 0.5 * keras.ops.mean(keras.ops.square(keras.ops.cast(y_true, y_pred.dtype) - y_pred), axis=-1)
'''


@keras.saving.register_keras_serializable(package="tbs_tests")
def scaled_squared_error(y_true, y_pred):
    """A registered custom loss, per sample, as users write them."""
    return 3.0 * keras.ops.mean(keras.ops.square(keras.ops.cast(y_true, y_pred.dtype) - y_pred), axis=-1)


def _small(name: str) -> keras.Model:
    return keras.Sequential([keras.Input((6,)), layers.Dense(8, name="d"), layers.Dense(3, name="head")], name=name)


def test_a_keras_file_is_profiled_with_the_loss_and_optimizer_it_was_compiled_with(tmp_path: Path) -> None:
    """Loaded with compile=False, a .keras file lost both: the stand-in cross-entropy and Adam were timed."""
    model = _small("sgd_custom")
    model.compile(loss=scaled_squared_error, optimizer=keras.optimizers.SGD(momentum=0.9, nesterov=True))
    path = tmp_path / "sgd_custom.keras"
    model.save(path)
    result = CliRunner().invoke(cli, ["profile", str(path), "--training", "--batch", "4", "--out",
                                      str(tmp_path / "p"), *FAST])
    assert result.exit_code == 0, result.output
    p = tbs.load(tmp_path / "p")
    training = p.metadata["training"]
    assert (training["loss"]["name"], training["loss"]["source"]) == ("scaled_squared_error", "model.compile")
    assert (training["optimizer"]["name"], training["optimizer"]["source"]) == ("SGD", "model.compile")
    config = training["optimizer"]["config"]
    assert config["momentum"] == pytest.approx(0.9) and config["nesterov"] is True
    assert "note" not in training
    dense = p.summary.set_index("layer").loc["d"]
    # Momentum keeps one slot per weight (Adam keeps two): the SGD really ran.
    assert dense["weight_bytes"] <= dense["slot_bytes"] < 2 * dense["weight_bytes"]


def test_a_keras_file_whose_compiled_loss_is_not_defined_here_runs_with_stand_ins_and_says_why(
        tmp_path: Path) -> None:
    source = tmp_path / "losses.py"
    source.write_text(UNREGISTERED_LOSS)
    from tbs.load.model import import_custom_objects, load_model

    loss = import_custom_objects([source])["half_squared_error"]
    model = _small("unknown_loss")
    model.compile(loss=loss, optimizer="rmsprop")
    path = tmp_path / "unknown_loss.keras"
    model.save(path)
    loaded = load_model(path, compile=True)
    assert not loaded.model.compiled and "half_squared_error" in loaded.compile_note
    assert "--custom-objects" in loaded.compile_note
    setup = resolve(loaded.model, compile_note=loaded.compile_note)
    assert (setup.loss_source, setup.optimizer_name) == ("stand-in", "Adam") and setup.note
    assert setup.as_dict(0)["note"] == loaded.compile_note
    given = load_model(path, import_custom_objects([source]), compile=True)  # with its code: compiled as saved
    assert given.model.compiled and not given.compile_note
    chosen = resolve(given.model)
    assert (chosen.loss_name, chosen.optimizer_name, chosen.note) == ("half_squared_error", "RMSprop", "")


def test_string_and_function_losses_are_reduced_and_weighted_as_compile_does(tmp_path: Path) -> None:
    """keras.losses.get(name) is the per-sample function: unreduced, it failed as 'does not fit the output'."""
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, [layers.Dense(3, name="classes")(inputs), layers.Dense(1, name="value")(inputs)],
                        name="two_heads")
    model.compile(loss=["sparse_categorical_crossentropy", "mean_squared_error"], loss_weights=[0.5, 2.0],
                  optimizer="adam")
    setup = resolve(model)
    assert setup.loss_name == "sparse_categorical_crossentropy+mean_squared_error"
    assert setup.weights == [0.5, 2.0] and setup.as_dict(0)["loss"]["weights"] == [0.5, 2.0]
    outputs = model(np.random.default_rng(1).standard_normal((6, 4)).astype("float32"))
    fit_to_outputs(setup, outputs)
    targets = setup.targets(outputs, 6, 0)
    expected = model.compute_loss(y=targets, y_pred=outputs)  # what fit() minimises
    assert float(setup.loss(targets, outputs)) == pytest.approx(float(expected), rel=1e-5)
    p = tbs.profile(model, [4], training=True, timing=FAST_TIMING, progress=None, report=False,
                    measure=tbs.MeasureConfig(analysis=False), out=tmp_path / "p")
    assert p.metadata["training"]["loss"]["weights"] == [0.5, 2.0]
    assert set(p.summary["status"]) <= {"ok", "noisy"}
    single = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    single.compile(loss="mse", optimizer="sgd")
    one = resolve(single)
    fit_to_outputs(one, single(np.ones((2, 3), np.float32)))  # raised "only 0-dimensional arrays" before
    assert one.loss_name == "mean_squared_error"


@pytest.mark.parametrize("units, expected", [(1, "binary_crossentropy"), (4, "sparse_categorical_crossentropy")])
def test_the_crossentropy_alias_is_resolved_from_the_output_as_compile_does(units: int, expected: str) -> None:
    model = keras.Sequential([keras.Input((3,)), layers.Dense(units, activation="sigmoid" if units == 1 else None)])
    model.compile(loss="crossentropy", optimizer="adam")
    setup = resolve(model)
    assert setup.loss_name == expected
    fit_to_outputs(setup, model(np.ones((2, 3), np.float32)))


def test_a_profile_trained_with_a_scripts_own_loss_function_is_verified_with_it(tmp_path: Path) -> None:
    """--verify replays the recorded loss: a function Keras does not know comes from the model passed again."""

    def local_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(keras.ops.cast(y_true, y_pred.dtype) - y_pred), axis=-1)

    model = _small("local_loss")
    model.compile(loss=local_loss, optimizer="sgd")
    p = tbs.profile(model, [4], training=True, timing=FAST_TIMING, progress=None, report=False, measure=tbs.MeasureConfig(analysis=False),
                    out=tmp_path / "p")
    assert p.metadata["training"]["loss"]["name"] == "local_loss"
    verification = tbs.verify(p, tbs.recommend(p, "time"), model=model)
    assert verification.results and verification.layers == 2
