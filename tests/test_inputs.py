import pickle

import numpy as np
import pytest

from keras_models import branchy_model, embedding_model, text_model
from tbs.errors import InputDataError
from tbs.load.inputs import (check_input_arrays, fit_to_batch, input_specs, load_user_input, read_input_file,
                             synthetic_batch)


def test_integers_stay_inside_the_embedding_vocabulary():
    specs = input_specs(embedding_model())
    (tokens,) = synthetic_batch(specs, 512)
    assert tokens.dtype == np.int32 and tokens.shape == (512, 7)
    assert tokens.min() >= 0 and tokens.max() < 50 and tokens.max() > 40


def test_text_is_made_of_vocabulary_words():
    model = text_model()
    (text,) = synthetic_batch(input_specs(model), 8)
    vocab = set(model.get_layer(index=1).get_vocabulary())
    words = {w for sentence in text.ravel() for w in sentence.split()}
    assert text.shape == (8, 1) and words <= vocab


def test_images_rescaled_by_the_model_get_pixel_values():
    image, extra = synthetic_batch(input_specs(branchy_model()), 4)
    assert image.shape == (4, 8, 8, 3) and image.max() > 2.0 and image.max() <= 255
    assert extra.max() <= 1.0


def test_user_input_checked_and_fitted(tmp_path):
    specs = input_specs(embedding_model())
    good = tmp_path / "good.npy"
    np.save(good, np.arange(14, dtype="int64").reshape(2, 7))
    (arr,) = load_user_input(good, specs)
    assert arr.dtype == np.int32
    (fitted,) = fit_to_batch([arr], 5)
    assert fitted.shape == (5, 7) and (fitted[2] == arr[0]).all()
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 9)))
    with pytest.raises(InputDataError, match=r"\(3, 9\).*does not fit"):
        load_user_input(bad, specs)


def test_user_input_npz_by_name_for_several_inputs(tmp_path):
    specs = input_specs(branchy_model())
    path = tmp_path / "data.npz"
    np.savez(path, extra=np.ones((2, 4)), image=np.zeros((2, 8, 8, 3)))
    image, extra = load_user_input(path, specs)
    assert image.shape == (2, 8, 8, 3) and extra.shape == (2, 4)
    with pytest.raises(InputDataError, match="holds 1 array"):
        np.save(tmp_path / "one.npy", np.zeros((2, 4)))
        load_user_input(tmp_path / "one.npy", specs)


def test_masked_embedding_never_gets_a_zero_and_float_indices_are_whole():
    from keras_models import keras

    model = keras.Sequential([keras.layers.Embedding(30, 4, mask_zero=True), keras.layers.LSTM(3)])
    model.build((None, 12))  # declared float32 input in front of an Embedding
    (tokens,) = synthetic_batch(input_specs(model), 64)
    assert tokens.min() >= 1 and tokens.max() < 30
    assert (tokens == tokens.round()).all() and tokens.max() > 20


def test_data_defines_the_inputs_of_a_model_that_declares_none(tmp_path):
    from tbs.load.inputs import structure_inputs

    path = tmp_path / "pair.npz"
    np.savez(path, a=np.ones((3, 2)), b=np.zeros((3, 5)))
    specs = []
    a, b = load_user_input(path, specs)
    assert [s.name for s in specs] == ["a", "b"] and specs[1].shape == (5,)
    packed = structure_inputs(object(), [a, b], specs)
    assert set(packed) == {"a", "b"}


def test_unknown_image_dims_become_a_realistic_size():
    from tbs.load.inputs import InputSpec

    assert InputSpec("img", (None, None, 3), "float32").concrete_shape(2) == (2, 224, 224, 3)
    assert InputSpec("seq", (None, 8), "float32").concrete_shape(2) == (2, 16, 8)


class _RunsCode:
    """Unpickling this writes a marker file: what a booby-trapped data file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_numpy_input_files_load_with_pickle_off(tmp_path, suffix):
    marker, path = tmp_path / "ran", tmp_path / f"evil{suffix}"
    trap = np.array([_RunsCode(marker), "text"], dtype=object)
    np.save(path, trap) if suffix == ".npy" else np.savez(path, text=trap)
    with pytest.raises(InputDataError) as info:
        load_user_input(path, input_specs(text_model()))
    message = str(info.value)
    assert not marker.exists()  # the file's code never ran
    assert str(path) in message and "\n" not in message
    assert "array.astype(str)" in message and ".pkl" in message


def test_text_saved_as_a_string_array_feeds_a_text_model(tmp_path):
    path = tmp_path / "reviews.npy"
    np.save(path, np.array([["alpha beta"], ["gamma delta"]]))  # dtype <U11: no pickle needed
    (text,) = load_user_input(path, input_specs(text_model()))
    assert text.dtype == object and text.shape == (2, 1) and text[1, 0] == "gamma delta"


def test_pickle_input_files_stay_trusted_and_may_hold_object_arrays(tmp_path):
    path = tmp_path / "reviews.pkl"
    path.write_bytes(pickle.dumps(np.array([["alpha beta"], ["zeta"]], dtype=object)))
    (text,) = load_user_input(path, input_specs(text_model()))
    assert text.shape == (2, 1) and text[0, 0] == "alpha beta"


def test_read_then_check_is_load_user_input(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, np.zeros((2, 8, 8, 3)), np.ones((2, 4)))
    data = read_input_file(path)
    assert isinstance(data, list) and [a.shape for a in data] == [(2, 8, 8, 3), (2, 4)]
    image, extra = check_input_arrays(data, input_specs(branchy_model()), f"--input {path}")
    assert image.dtype == np.float32 and extra.shape == (2, 4)


def test_in_memory_arrays_are_checked_with_their_own_wording():
    specs = input_specs(embedding_model())
    (tokens,) = check_input_arrays(np.ones((3, 7), dtype="int64"), specs, "the input arrays")
    assert tokens.dtype == np.int32
    with pytest.raises(InputDataError, match=r"^the input arrays: array of shape \(3, 2\) does not fit"):
        check_input_arrays(np.ones((3, 2)), specs, "the input arrays")
    with pytest.raises(InputDataError, match=r"^the input arrays: holds 2 array"):
        check_input_arrays([np.ones((3, 7)), np.ones((3, 7))], specs, "the input arrays")
    declared: list = []
    check_input_arrays({"a": np.ones((2, 3))}, declared, "the input arrays")
    assert [(s.name, s.shape, s.keyed) for s in declared] == [("a", (3,), True)]


def test_a_dict_feeds_several_inputs_by_name_only():
    from tbs.load.inputs import InputSpec

    specs = [InputSpec("image", (4,), "float32"), InputSpec("extra", (2,), "float32")]
    image, extra = check_input_arrays({"extra": np.ones((3, 2)), "image": np.zeros((3, 4))}, specs, "the input arrays")
    assert image.shape == (3, 4) and extra.shape == (3, 2)
    wrong = {"a": np.zeros((3, 4)), "b": np.ones((3, 2))}  # in the right order, but not named: refused
    with pytest.raises(InputDataError) as info:
        check_input_arrays(wrong, specs, "--input data.npz")
    message = str(info.value)
    assert message.startswith("--input data.npz: arrays named 'a', 'b' do not match the model's inputs "
                              "'image', 'extra'; key each array")
    assert "\n" not in message


def test_a_dict_of_one_array_feeds_a_one_input_model_under_any_key():
    from tbs.load.inputs import InputSpec

    specs = [InputSpec("tokens", (7,), "int32")]
    (tokens,) = check_input_arrays({"whatever": np.ones((2, 7), dtype="int64")}, specs, "the input arrays")
    assert tokens.dtype == np.int32 and tokens.shape == (2, 7)
