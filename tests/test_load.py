"""Loading models: Keras's safe mode made actionable, and in-memory models copied per device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from keras_models import keras, sequential_model
from tbs.errors import ModelLoadError
from tbs.load.model import ModelSource, import_custom_objects, load_model, load_model_object


def _lambda_model_file(tmp_path: Path) -> Path:
    inputs = keras.Input((3,))
    doubled = keras.layers.Lambda(lambda x: x * 2)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(doubled), name="with_lambda")
    path = tmp_path / "with_lambda.keras"
    model.save(path)
    return path


def test_lambda_keras_file_names_the_tbs_fix_not_keras_s(tmp_path):
    path = _lambda_model_file(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    message = str(info.value)
    assert "--no-safe-mode" in message and "safe_mode=False" in message and "\n" not in message
    assert str(path) in message and "Lambda" in message
    assert "loading function" not in message  # Keras's advice, which a tbs user cannot follow


def test_safe_mode_off_loads_a_trusted_lambda_file(tmp_path):
    loaded = load_model(_lambda_model_file(tmp_path), safe_mode=False)
    out = loaded.model(np.ones((1, 3), dtype="float32"))
    assert loaded.format == "keras" and tuple(out.shape) == (1, 2)
    assert loaded.describe()["path"] == str(tmp_path / "with_lambda.keras")


def test_a_keras_2_era_h5_file_loads_under_the_same_safe_mode_as_a_keras_file(tmp_path):
    """Keras 3 still writes and reads the legacy .h5 format; tbs refused it ("save it as .keras")."""
    model = sequential_model()
    plain = tmp_path / "tiny.h5"
    model.save(plain)  # Keras 3 logs that .h5 is legacy, and writes it
    loaded = load_model(plain)
    x = np.random.rand(2, 6).astype("float32")
    assert loaded.format == "h5" and loaded.name == "tiny"
    np.testing.assert_allclose(np.asarray(loaded.model(x)), np.asarray(model(x)), rtol=1e-6)
    model.compile(optimizer="adam", loss="mse")
    model.save(plain)
    note = load_model(plain, compile=True).compile_note  # Keras 3.15 cannot read the loss it wrote by name
    assert note == "" or ("--loss and --optimizer" in note and "--custom-objects" not in note), note
    inputs = keras.Input((3,))
    lambda_h5 = tmp_path / "with_lambda.h5"
    keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Lambda(lambda x: x * 2)(inputs))).save(lambda_h5)
    with pytest.raises(ModelLoadError, match="contains a Lambda layer .*--no-safe-mode"):
        load_model(lambda_h5)
    assert load_model(lambda_h5, safe_mode=False).format == "h5"


def test_what_is_not_a_whole_model_in_h5_says_so_in_one_line(tmp_path):
    weights = tmp_path / "only.weights.h5"
    sequential_model().save_weights(weights)
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(b"not hdf5" * 8)
    for path, fragment in ((weights, "holds only weights, not the model; save the Keras model itself"),
                           (damaged, "is corrupt or truncated")):
        with pytest.raises(ModelLoadError) as info:
            load_model(path)
        assert fragment in str(info.value) and "\n" not in str(info.value)


def test_in_memory_model_copies_are_independent_and_leave_the_original_alone():
    original = sequential_model()
    before = [w.copy() for w in original.get_weights()]
    first, second = load_model_object(original), load_model_object(original)
    assert first.model is not second.model and first.model is not original
    for a, b, o in zip(first.model.get_weights(), second.model.get_weights(), before):
        assert np.array_equal(a, b) and np.array_equal(a, o)
    first.model.layers[0].kernel.assign(np.zeros_like(before[0]))
    assert np.array_equal(original.get_weights()[0], before[0])  # a copy's change never reaches the original
    assert np.array_equal(second.model.get_weights()[0], before[0])
    assert first.sha256 == second.sha256  # one pickle, reused for every copy
    info = first.describe()
    assert info["path"] is None and info["format"] == "in-memory" and info["name"] == "tiny_seq"


def test_one_model_source_serves_every_device_copy(monkeypatch):
    """Pickled (and hashed) once per run, not once per device; a trained model gets a new identity."""
    pickled = []
    real = ModelSource.of.__func__
    monkeypatch.setattr(ModelSource, "of", classmethod(lambda cls, m: pickled.append(m) or real(cls, m)))
    model = sequential_model()
    source = ModelSource.of(model)
    copies = [load_model_object(source).model for _ in range(3)]
    assert len(pickled) == 1 and len({id(c) for c in copies}) == 3
    model.layers[0].kernel.assign(np.ones(model.layers[0].kernel.shape))  # trained since: another model
    assert ModelSource.of(model).sha256 != source.sha256


def test_in_memory_copy_is_made_under_the_scope():
    entered = []

    class Scope:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    source = ModelSource.of(sequential_model())
    loaded = load_model_object(source, scope=Scope)
    assert entered == [True] and loaded.sha256 == source.sha256


def test_in_memory_custom_classes_need_no_registration(subclassed_pkl, custom_source):
    model = load_model(subclassed_pkl, import_custom_objects([custom_source])).model
    copy = load_model_object(model).model
    x = np.ones((2, 5), dtype="float32")
    assert type(copy) is type(model) and np.allclose(copy(x), model(x))


def test_an_in_memory_model_compiled_with_an_unregistered_loss_is_copied_with_its_compile():
    """Keras's loader restores the compile() of every copy: the script's own loss function must be offered to it."""

    def local_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(keras.ops.cast(y_true, y_pred.dtype) - y_pred), axis=-1)

    model = sequential_model()
    model.compile(loss=local_loss, optimizer=keras.optimizers.SGD(momentum=0.5))
    copy = load_model_object(model).model
    assert copy.compiled and copy.loss is local_loss and copy.optimizer.momentum == 0.5


@pytest.mark.parametrize("thing, fragment", [
    (object(), "builtins.object, not a Keras model"),
    (keras.layers.Dense(2), "a Keras layer, not a Keras model"),
    (keras.Sequential([keras.layers.Dense(2)]), "never built"),
])
def test_in_memory_non_models_are_refused_in_one_line(thing, fragment):
    with pytest.raises(ModelLoadError) as info:
        load_model_object(thing)
    assert fragment in str(info.value) and "\n" not in str(info.value)
