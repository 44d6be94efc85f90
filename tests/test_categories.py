import pytest

from tbs.capture.categories import categorize, kind_of
from keras_models import keras

layers = keras.layers


@pytest.mark.parametrize("cls, category", [
    (layers.RandomRotation, "preprocessing"), (layers.TextVectorization, "preprocessing"),
    (layers.Rescaling, "preprocessing"), (layers.Embedding, "embedding"), (layers.Dense, "dense"),
    (layers.Conv2D, "conv"), (layers.DepthwiseConv2D, "conv"), (layers.LSTM, "rnn"),
    (layers.SimpleRNN, "rnn"), (layers.MaxPooling2D, "pooling"), (layers.BatchNormalization, "normalization"),
    (layers.MultiHeadAttention, "attention"), (layers.Flatten, "reshape"), (layers.Add, "merge"),
    (layers.Dropout, "other"), (layers.ReLU, "activation"), (layers.Activation, "activation"),
    (layers.Softmax, "activation"), (layers.Concatenate, "merge"), (layers.ZeroPadding2D, "reshape"),
    (layers.Identity, "other"),
])
def test_keras_layers(cls, category):
    assert categorize(cls) == category


def test_custom_layers_fall_back_to_their_name():
    class MyConvBlock(keras.layers.Layer):
        pass

    class Thing(keras.layers.Layer):
        pass

    assert categorize(MyConvBlock) == "conv"
    assert categorize(Thing) == "other"


def test_custom_activation_falls_back_to_its_name():
    class MyGELU(keras.layers.Layer):
        pass

    assert categorize(MyGELU) == "activation"


def test_older_profiles_other_becomes_the_keras_kind():
    """A profile recorded before these kinds existed says 'other' for ReLU, Add and ZeroPadding2D."""
    assert [kind_of(t, "other") for t in ("ReLU", "Activation", "Add", "ZeroPadding2D", "Dropout")] == [
        "activation", "activation", "merge", "reshape", "other"]
    assert kind_of("Conv2D", "conv") == "conv" and kind_of("Odd", "made-up") == "other"
