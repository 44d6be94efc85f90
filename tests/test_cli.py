"""The CLI through click's CliRunner: real TensorFlow on tiny models, fast statistics."""

import json
import pickle

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST
from keras_models import keras
from tbs.cli import cli


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result


def profile(model, out, *extra):
    return run("profile", model, "--out", out, *FAST, *extra)


def test_profile_writes_every_cell_and_prints_tables(seq_pkl, tmp_path):
    out = tmp_path / "p"
    result = profile(seq_pkl, out, "--batch", "4,16", "--cost", "cpu=0.5,gpu=3")
    assert result.exit_code == 0, result.output + result.stderr
    summary = pd.read_csv(out / "summary.csv")
    for column in ["layer", "layer_type", "category", "device", "batch_size", "n", "median_s", "p25_s",
                   "p75_s", "per_sample_s", "cost_per_sample_usd", "status"]:
        assert column in summary.columns
    assert sorted(summary["layer"].unique()) == ["dense", "dense_1", "dropout"]
    assert sorted(summary["batch_size"].unique()) == [4, 16]
    assert set(summary["status"]) <= {"ok", "noisy"}
    row = summary.iloc[0]
    assert row["per_sample_s"] == pytest.approx(row["median_s"] / row["batch_size"])
    assert row["cost_per_sample_usd"] == pytest.approx(row["per_sample_s"] * 0.5 / 3600)
    samples = pd.read_csv(out / "samples.csv")
    assert (samples.groupby(["layer", "batch_size"]).size() >= 3).all()
    model = pd.read_csv(out / "model.csv")
    assert len(model) == 2 and model["layers_sum_s"].notna().all() and model["dispatch_overhead_s"].notna().all()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["mode"] == "inference"
    assert [l["name"] for l in meta["layers"]] == ["dense", "dropout", "dense_1"]
    if not any(d["kind"] == "gpu" for d in meta["devices"]):  # the GPU's price: one line says why it prices nothing
        said = [line for line in result.stderr.splitlines() if "gpu=3 $/h prices nothing" in line]
        assert len(said) == 1 and meta["devices_missing"]["gpu"] in said[0], result.stderr
    assert {"src", "dst", "shape", "bytes"} <= set(meta["graph"]["4"][0])
    assert meta["settings"]["xla_jit_compile"] is False and "intra_op_threads" in meta["settings"]
    assert meta["host"]["cpu_model"] and meta["versions"]["tensorflow"]
    assert "batch 4: time per sample" in result.output and "whole model" in result.output
    assert "Σ layers" in result.output


def test_functional_keras_file_every_leaf_layer_profiled(branchy_keras, tmp_path):
    out = tmp_path / "p"
    result = profile(branchy_keras, out, "--batch", "2")  # training mode: tests/test_training.py
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["layer"]) == {"augment/random_flip", "augment/rescaling", "left", "right", "merge",
                                     "pool", "join", "head_a", "head_b"}
    assert set(summary["mode"]) == {"inference"}


def test_subclassed_model_needs_its_classes(subclassed_pkl, custom_source, tmp_path):
    missing = profile(subclassed_pkl, tmp_path / "a", "--batch", "2")
    assert missing.exit_code == 2
    assert "TinySubclassed" in missing.stderr and "--custom-objects" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    ok = profile(subclassed_pkl, tmp_path / "b", "--batch", "2", "--custom-objects", custom_source)
    assert ok.exit_code == 0, ok.stderr
    assert list(pd.read_csv(tmp_path / "b" / "summary.csv")["layer_type"]) == ["Dense", "Doubler", "Dense"]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.pkl").write_bytes(b"")
    (d / "corrupt.pkl").write_bytes(b"\x80\x05garbage" * 10)
    (d / "model.h5").write_bytes(b"x")
    (d / "model.onnx").write_bytes(b"x")
    with open(d / "dict.pkl", "wb") as f:
        pickle.dump({"not": "a model"}, f)
    np.save(d / "wrong.npy", np.zeros((2, 99)))
    return d


@pytest.mark.parametrize("args, fragment", [
    (["{model}", "--batch", "0"], "batch size 0"),
    (["{model}", "--batch", "-5"], "batch size -5"),
    (["{model}", "--batch", "abc"], "'abc'"),
    (["{model}", "--cost", "gpu=-1"], "-1"),
    (["{model}", "--cost", "gpu=abc"], "'abc'"),
    (["{model}", "--devices", "quantum"], "'quantum'"),
    (["{bad}/missing.pkl"], "does not exist"),
    (["{bad}/empty.pkl"], "is empty"),
    (["{bad}/corrupt.pkl"], "corrupt"),
    (["{bad}/dict.pkl"], "not a Keras model"),
    (["{bad}/model.h5"], "corrupt or truncated"),
    (["{bad}/model.onnx"], "unsupported format '.onnx'; save it as .keras or .h5"),
    (["{model}", "--input", "{bad}/wrong.npy"], "(2, 99)"),
    (["{model}", "--input", "{bad}/nothing.npy"], "does not exist"),
    (["{model}", "--custom-objects", "{bad}/nothing.py"], "does not exist"),
])
def test_bad_input_one_line_exit_2(args, fragment, seq_pkl, bad_files, tmp_path):
    args = [a.format(model=seq_pkl, bad=bad_files) for a in args]
    result = run("profile", *args, "--out", tmp_path / "p")
    assert result.exit_code == 2, (result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], result.stderr
    assert not (tmp_path / "p" / "summary.csv").exists()


def test_h5_files_profile_and_a_lambda_in_one_needs_no_safe_mode(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda x: x * 2, name="double"),
                              keras.layers.Dense(2, name="output")])
    path = tmp_path / "legacy.h5"
    model.save(path)
    refused = profile(path, tmp_path / "a", "--batch", "2")
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "--no-safe-mode" in refused.stderr
    ok = profile(path, tmp_path / "b", "--batch", "2", "--no-safe-mode")
    assert ok.exit_code == 0, ok.stderr
    assert set(pd.read_csv(tmp_path / "b" / "summary.csv")["layer"]) == {"double", "output"}
    assert json.loads((tmp_path / "b" / "metadata.json").read_text())["model"]["format"] == "h5"


@pytest.mark.parametrize("save", ["export", "tf.saved_model.save"])
def test_a_saved_model_directory_says_how_to_save_the_keras_model_in_one_line(save, tmp_path):
    import tensorflow as tf

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "exported"
    model.export(path, verbose=False) if save == "export" else tf.saved_model.save(model, str(path))
    for given in (path, path / "saved_model.pb"):
        result = profile(given, tmp_path / "p", "--batch", "2")
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"'{path}' is a TensorFlow SavedModel" in lines[0]
        assert "model.save('model.keras')" in lines[0]


def test_failing_layer_is_recorded_and_the_run_goes_on(tmp_path):
    class EagerOnly(keras.layers.Layer):
        def call(self, x):
            return x * float(np.asarray(x).mean() * 0 + 1)  # needs a concrete value: fails when compiled

    model = keras.Sequential([keras.Input((3,)), EagerOnly(name="eager_only"), keras.layers.Dense(2, name="d")])
    path = tmp_path / "m.keras"
    model.save(path)
    result = profile(path, tmp_path / "p", "--batch", "2", "--custom-objects", _write_class(tmp_path, EagerOnly))
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(tmp_path / "p" / "summary.csv").set_index("layer")
    assert summary.loc["eager_only", "status"] == "error" and isinstance(summary.loc["eager_only", "reason"], str)
    assert summary.loc["d", "status"] in ("ok", "noisy")


def _write_class(tmp_path, cls):
    source = tmp_path / "eager_only.py"
    source.write_text(
        "import keras, numpy as np\n"
        "class EagerOnly(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return x * float(np.asarray(x).mean() * 0 + 1)\n"
    )
    return source


def test_unfinished_profile_needs_resume_and_resume_measures_only_missing(seq_pkl, tmp_path):
    out = tmp_path / "p"
    assert profile(seq_pkl, out, "--batch", "4").exit_code == 0
    summary = pd.read_csv(out / "summary.csv")
    kept = summary[summary["layer"] != "dense_1"]
    kept.to_csv(out / "summary.csv", index=False)  # as if killed before dense_1 finished
    meta = json.loads((out / "metadata.json").read_text())
    meta["status"] = "interrupted"
    (out / "metadata.json").write_text(json.dumps(meta))
    refused = profile(seq_pkl, out, "--batch", "4")
    assert refused.exit_code == 2 and "--resume" in refused.stderr
    resumed = profile(seq_pkl, out, "--batch", "4", "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    after = pd.read_csv(out / "summary.csv")
    assert sorted(after["layer"]) == ["dense", "dense_1", "dropout"]
    pd.testing.assert_frame_equal(after[after["layer"] != "dense_1"].reset_index(drop=True),
                                  kept.reset_index(drop=True), check_dtype=False)
    assert json.loads((out / "metadata.json").read_text())["status"] == "complete"


def test_devices_lists_cpu_and_why_others_are_missing():
    result = run("devices")
    assert result.exit_code == 0
    assert "cpu:0" in result.output
    assert "gpu" in result.output and "tpu" in result.output


def test_missing_devices_are_skipped_with_reason(seq_pkl, tmp_path):
    result = profile(seq_pkl, tmp_path / "p", "--batch", "2", "--devices", "cpu,gpu")
    assert result.exit_code == 0
    assert "skipping gpu" in result.stderr
    only_gpu = profile(seq_pkl, tmp_path / "q", "--batch", "2", "--devices", "tpu")
    assert only_gpu.exit_code == 2 and "none of the requested devices" in only_gpu.stderr


def test_batch_too_big_for_host_memory_is_recorded_as_oom(seq_pkl, tmp_path, monkeypatch):
    import tbs.measure.headroom

    monkeypatch.setattr(tbs.measure.headroom, "memory_headroom_bytes", lambda: 64 * 1024)  # 64 KiB "free"
    result = profile(seq_pkl, tmp_path / "p", "--batch", "2,4096")
    assert result.exit_code == 0, result.stderr
    summary = pd.read_csv(tmp_path / "p" / "summary.csv")
    big = summary[summary["batch_size"] == 4096]
    assert set(big["status"]) == {"oom"} and big["reason"].str.contains("GiB").all()
    assert set(summary[summary["batch_size"] == 2]["status"]) <= {"ok", "noisy"}
    assert "OOM" in result.output


def test_xla_choice_is_applied_and_recorded(seq_pkl, tmp_path):
    result = profile(seq_pkl, tmp_path / "p", "--batch", "2", "--xla")
    assert result.exit_code == 0, result.stderr
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["settings"]["xla_jit_compile"] is True
    assert set(pd.read_csv(tmp_path / "p" / "summary.csv")["status"]) <= {"ok", "noisy"}


def test_forward_pass_failing_on_the_data_is_one_line(tmp_path, custom_source):
    source = tmp_path / "broken.py"
    source.write_text("import keras\nclass Broken(keras.layers.Layer):\n"
                      "    def call(self, x):\n        raise ValueError('cannot handle this input')\n"
                      "    def compute_output_shape(self, s):\n        return s\n")
    from tbs.load.model import import_custom_objects

    broken = import_custom_objects([source])["Broken"]
    model = keras.Sequential([keras.Input((3,)), broken()])
    model.save(tmp_path / "broken.keras")
    result = profile(tmp_path / "broken.keras", tmp_path / "p", "--custom-objects", source)
    assert result.exit_code == 2
    assert "forward pass fails" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_resume_refuses_other_settings_and_retries_failed_cells(seq_pkl, tmp_path):
    out = tmp_path / "p"
    assert profile(seq_pkl, out, "--batch", "4").exit_code == 0
    summary = pd.read_csv(out / "summary.csv")
    summary.loc[summary["layer"] == "dense_1", ["status", "median_s"]] = ["oom", None]
    summary.to_csv(out / "summary.csv", index=False)
    meta = json.loads((out / "metadata.json").read_text())
    (out / "metadata.json").write_text(json.dumps(dict(meta, status="interrupted")))
    other = profile(seq_pkl, out, "--batch", "4", "--resume", "--training")
    assert other.exit_code == 2 and "mode differs" in other.stderr
    again = profile(seq_pkl, out, "--batch", "4", "--resume")
    assert again.exit_code == 0, again.stderr
    retried = pd.read_csv(out / "summary.csv").set_index("layer")
    assert retried.loc["dense_1", "status"] in ("ok", "noisy") and len(retried) == 3


def test_a_failed_run_does_not_block_the_next(tmp_path, seq_pkl):
    out = tmp_path / "p"
    out.mkdir()
    (out / "metadata.json").write_text(json.dumps({"status": "failed"}))
    assert profile(seq_pkl, out, "--batch", "2").exit_code == 0


def test_unwritable_out_and_bare_command(seq_pkl, tmp_path):
    (tmp_path / "file").write_text("")
    bad = profile(seq_pkl, tmp_path / "file" / "p", "--batch", "2")
    assert bad.exit_code == 2 and "cannot create profile directory" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    blocked = CliRunner().invoke(cli, [])
    assert blocked.exit_code == 0 and "profile" in blocked.output and "devices" in blocked.output


def test_help_shows_percent_signs_once():
    for command in ("profile", "report"):
        text = run(command, "--help").output
        assert "%%" not in text
    assert "95% CI" in " ".join(run("profile", "--help").output.split())
