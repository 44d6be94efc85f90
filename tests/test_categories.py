import pytest

from tbs.capture.categories import categorize
from keras_models import keras

layers = keras.layers


@pytest.mark.parametrize("cls, category", [
    (layers.RandomRotation, "preprocessing"), (layers.TextVectorization, "preprocessing"),
    (layers.Rescaling, "preprocessing"), (layers.Embedding, "embedding"), (layers.Dense, "dense"),
    (layers.Conv2D, "conv"), (layers.DepthwiseConv2D, "conv"), (layers.LSTM, "rnn"),
    (layers.SimpleRNN, "rnn"), (layers.MaxPooling2D, "pooling"), (layers.BatchNormalization, "normalization"),
    (layers.MultiHeadAttention, "attention"), (layers.Flatten, "other"), (layers.Add, "other"),
    (layers.Dropout, "other"),
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
