"""The shipped example models and keras.applications models profile with every leaf layer."""

import importlib.util

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST, ROOT
from keras_models import keras
from tbs.capture.recorder import capture
from tbs.cli import cli
from tbs.load.inputs import input_specs, structure_inputs, synthetic_batch

spec = importlib.util.spec_from_file_location("example_models", ROOT / "models" / "build.py")
examples = importlib.util.module_from_spec(spec)
spec.loader.exec_module(examples)


def _leaf_layers(model):
    """Layers of the model and of models nested in it (a layer's own sublayers belong to it)."""
    leaves = []
    for layer in getattr(model, "operations", model.layers):
        if isinstance(layer, keras.Model):
            leaves.extend(_leaf_layers(layer))
        elif not isinstance(layer, keras.layers.InputLayer):
            leaves.append(layer)
    return leaves


@pytest.mark.parametrize("name", examples.DEFAULT)
def test_example_model_capture_sees_every_leaf(name):
    model = examples.BUILDERS[name]()
    inputs = structure_inputs(model, synthetic_batch(input_specs(model), 2))
    calls = capture(model, inputs, training=False).calls
    assert {id(c.op) for c in calls} == {id(l) for l in _leaf_layers(model)}


def test_example_builder_writes_a_loadable_pickle(tmp_path):
    path = examples.build("nn_twins", tmp_path)
    result = CliRunner().invoke(cli, ["profile", str(path), "--out", str(tmp_path / "p"), "--batch", "2,8", *FAST])
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(tmp_path / "p" / "summary.csv")
    assert len(summary) == 2 * 2


def test_text_model_profiles_string_inputs(tmp_path):
    path = examples.build("lm_imdb", tmp_path)
    result = CliRunner().invoke(cli, ["profile", str(path), "--out", str(tmp_path / "p"), "--batch", "3", *FAST])
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(tmp_path / "p" / "summary.csv")
    assert list(summary["category"]) == ["preprocessing", "embedding", "pooling", "dense", "dense"]
    assert set(summary["status"]) <= {"ok", "noisy"}


def test_keras_applications_model_every_leaf_in_summary(tmp_path):
    keras.backend.clear_session()
    model = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=4,
                                                 include_preprocessing=True)
    path = tmp_path / "mobilenet.keras"
    model.save(path)
    # Every leaf's own row is what this pins; the in-context trace (a third or more of this run) has
    # tests/test_in_context.py.
    args = ["profile", str(path), "--out", str(tmp_path / "p"), "--batch", "2", "--min-samples", "3",
            "--max-cell-seconds", "0.01", "--min-block-ms", "0.2", "--min-span-seconds", "0", "--no-analysis",
            "--no-in-context"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(tmp_path / "p" / "summary.csv")
    expected = {l.name for l in _leaf_layers(model)}  # layers and graph ops (x + 3 in hard-swish)
    assert set(summary["layer"]) == expected
    assert set(summary["status"]) <= {"ok", "noisy"}


def test_identical_layers_are_measured_once_and_every_one_keeps_its_row(tmp_path):
    """Three identical Dense(16) on 16 features: one is measured, the other two share its row (named in
    shared_with) and are still summed; --no-dedupe measures each."""
    keras.backend.clear_session()
    inputs = keras.Input((16,), name="x")
    x = inputs
    for i in range(3):
        x = keras.layers.Dense(16, activation="relu", name=f"block_{i}")(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(x))
    path = tmp_path / "repeats.keras"
    model.save(path)
    fast = ["--batch", "4", "--min-samples", "3", "--max-cell-seconds", "0.01", "--min-block-ms", "0.2",
            "--min-span-seconds", "0", "--no-analysis"]
    for flag, shared in (([], {"block_1": "block_0", "block_2": "block_0"}), (["--no-dedupe"], {})):
        out = tmp_path / ("p" + "".join(flag))
        result = CliRunner().invoke(cli, ["profile", str(path), "--out", str(out), *fast, *flag])
        assert result.exit_code == 0, result.stderr
        summary = pd.read_csv(out / "summary.csv").set_index("layer")
        assert summary["shared_with"].dropna().to_dict() == shared
        for layer, representative in shared.items():
            assert summary.loc[layer, "median_s"] == summary.loc[representative, "median_s"]
        samples = pd.read_csv(out / "samples.csv")
        assert set(samples[samples["target"] == "layer"]["layer"]) == set(summary.index) - set(shared)
        model_row = pd.read_csv(out / "model.csv").iloc[0]
        assert model_row["layers_sum_s"] == pytest.approx(summary["median_s"].sum())  # shared rows are summed


def test_bert_encoder_is_built_from_keras_layers_and_captured_whole():
    """models/build.py's bert_base, at a small size: every leaf call seen, tokens in range, one row per block part."""
    model = examples.bert_encoder(blocks=2, width=32, heads=4, sequence=16, ffn=64, vocabulary=100)
    inputs = structure_inputs(model, synthetic_batch(input_specs(model), 2))
    calls = capture(model, inputs, training=False).calls
    assert {id(c.op) for c in calls} == {id(l) for l in _leaf_layers(model)}
    names = [c.op.name for c in calls]
    assert names[:2] == ["token_embedding", "embedding_norm"] and names[-2:] == ["pool", "classifier"]
    assert sum(isinstance(c.op, keras.layers.MultiHeadAttention) for c in calls) == 2
    assert model.output_shape == (None, 2)
