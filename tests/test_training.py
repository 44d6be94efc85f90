"""Training profiles: which gradients a real step computes, the phases of every cell, the loss, the whole step.

The TensorFlow runners are pinned in test_tf_training.py; here the plan and the
profile, on TensorFlow in-process and on JAX through a real subprocess (Keras picks
one backend per process).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST
from keras_models import _pickle, branchy_model, embedding_model, keras, layers

import tbs
from tbs.capture.recorder import capture
from tbs.cli import cli
from tbs.errors import TbsError
from tbs.load.train_setup import fit_to_outputs, resolve
from tbs.measure.train_cells import gradient_plan
from tbs.schema import LOSS_LAYER

FAST_TIMING = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
# The compiler's analysis of every phase (half or more of a tiny training profile's time) is pinned by
# test_analysis.py's TensorFlow training profile and the JAX one here; the other profiles skip it.
NO_ANALYSIS = tbs.MeasureConfig(analysis=False)


def _plan(model: keras.Model, inputs: object) -> dict[str, list[bool]]:
    return gradient_plan(capture(model, inputs, True).calls)


def test_gradient_plan_asks_only_for_gradients_a_real_step_computes() -> None:
    plan = _plan(branchy_model(), [np.random.rand(2, 8, 8, 3).astype("float32"), np.random.rand(2, 4).astype("float32")])
    # Preprocessing in front of the first trainable layer: no input gradient, so no backward at all.
    assert plan["augment/random_flip"] == [False] and plan["augment/rescaling"] == [False]
    assert plan["left"] == [False] and plan["right"] == [False]  # the first trainable layers: weights only
    assert plan["merge"] == [True, True]  # both branches lead back to trainable convolutions
    assert plan["join"] == [True, False]  # the model's second input needs no gradient
    assert plan["head_a"] == [True] and plan["head_b"] == [True]


def test_integer_inputs_never_get_a_gradient() -> None:
    plan = _plan(embedding_model(), np.random.randint(0, 50, size=(2, 7)).astype("int32"))
    assert list(plan.values()) == [[False], [True], [True]]  # embedding (int ids), lstm, dense


def test_stand_in_loss_fits_the_output_and_a_chosen_loss_that_does_not_is_refused() -> None:
    regression = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    classes = keras.Sequential([keras.Input((3,)), layers.Dense(4, activation="softmax")])
    assert resolve(regression).loss_name == "MeanSquaredError"
    setup = resolve(classes)
    assert setup.loss_name == "SparseCategoricalCrossentropy" and not setup.losses[0].from_logits
    assert (setup.optimizer_name, setup.optimizer_source) == ("Adam", "stand-in")
    targets = setup.targets([np.zeros((6, 4), np.float32)], 6, 0)
    assert targets[0].shape == (6,) and targets[0].dtype == np.int32 and targets[0].max() < 4
    wrong = resolve(regression, loss="sparse_categorical_crossentropy")
    with pytest.raises(TbsError, match="--loss sparse_categorical_crossentropy needs class scores"):
        fit_to_outputs(wrong, regression(np.zeros((2, 3), np.float32)))
    with pytest.raises(TbsError, match="unknown optimizer 'nosuch'"):
        resolve(regression, optimizer="nosuch")
    with pytest.raises(TbsError, match="unknown loss 'nosuch'"):
        resolve(regression, loss="nosuch")


def test_the_models_own_compiled_loss_and_optimizer_are_used() -> None:
    model = keras.Sequential([keras.Input((3,)), layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    setup = resolve(model)
    assert (setup.loss_name, setup.loss_source) == ("mean_squared_error", "model.compile")
    assert (setup.optimizer_name, setup.optimizer_source) == ("SGD", "model.compile")
    assert setup.make_optimizer() is not setup.make_optimizer()  # a fresh one per program


@pytest.mark.parametrize("args, message", [
    (["--training", "--optimizer", "nosuch"], "unknown optimizer 'nosuch'"),
    (["--training", "--loss", "categorical_crossentropy"], "needs class scores"),
    (["--loss", "mse"], "--loss sets what training uses: add --training"),
])
def test_bad_training_options_get_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    model = _pickle(keras.Sequential([keras.Input((3,)), layers.Dense(1)], name="reg"), tmp_path / "reg.pkl")
    result = CliRunner().invoke(cli, ["profile", str(model), "--out", str(tmp_path / "p"), *FAST, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("Warning:")]
    assert len(lines) == 1  # (a warning says when another tbs run measures on the machine)


def _check_training_profile(p: tbs.Profile, leaves: set[str], optimizer: str = "Adam") -> None:
    rows = p.summary
    assert set(rows["mode"]) == {"training"}
    assert leaves | {LOSS_LAYER} == set(rows["layer"])
    measured = rows[rows["status"].isin(["ok", "noisy"])]
    assert len(measured) == len(rows), rows[["layer", "status", "reason"]]
    total = measured["forward_s"] + measured["backward_s"] + measured["update_s"]
    assert np.allclose(total, measured["median_s"], rtol=1e-6)
    # A tiny layer at batch 4 can time as 0 once the harness's own cost is subtracted, and on a loaded VM
    # (a 3 ms per-call cost against microseconds of work) every layer can: so each layer's forward is
    # checked for real raw samples, and the medians only for being never negative.
    assert (measured["forward_s"] >= 0).all()
    forward = p.samples[(p.samples["phase"] == "forward") & (p.samples["target"] == "layer")]
    assert set(forward["layer"]) == set(measured["layer"]) and (forward["raw_seconds"] > 0).all()
    loss = rows[rows["layer"] == LOSS_LAYER].iloc[0]
    assert loss["phases"] == "forward+backward" and loss["update_s"] == 0 and loss["category"] == "loss"
    model = p.model.iloc[0]
    # Its layers' sum is the sum of the medians of every layer the step runs (every one, when all resolved to 0).
    in_step = measured[measured["in_step"].map(lambda v: v is not False)]
    assert model["status"] in ("ok", "noisy") and len(in_step) == model["layers_measured"]
    assert model["layers_sum_s"] == pytest.approx(in_step["median_s"].sum())
    assert p.metadata["training"]["optimizer"]["name"] == optimizer
    assert [s for s in p.samples["phase"].unique()] and "step" in set(p.samples["phase"])


def test_every_leaf_of_a_dag_with_a_nested_model_gets_its_phases_on_tensorflow(tmp_path: Path) -> None:
    p = tbs.profile(branchy_model(), [4], training=True, timing=FAST_TIMING, progress=None, report=False,
                    measure=NO_ANALYSIS, out=tmp_path / "p")
    leaves = {"augment/random_flip", "augment/rescaling", "left", "right", "merge", "pool", "join", "head_a", "head_b"}
    _check_training_profile(p, leaves)
    rows = p.summary.set_index("layer")
    assert rows.loc["augment/rescaling", "phases"] == "forward"  # before any trainable layer: no backward
    assert rows.loc["left", "phases"] == "forward+backward+update"
    assert rows.loc["merge", "phases"] == "forward+backward"  # no weights, but its inputs need gradients
    assert rows.loc["left", "slot_bytes"] >= 2 * rows.loc["left", "weight_bytes"]  # Adam: two slots per weight
    graph = p.metadata["graph"]["4"]
    assert any(e["dst"] == LOSS_LAYER for e in graph)
    assert not [e for e in graph if e["dst"] == "join" and e["src"].startswith("/input/")][0]["grad"]
    assert p.metadata["training"]["loss"]["name"] == "MeanSquaredError+SparseCategoricalCrossentropy" or \
        p.metadata["training"]["loss"]["source"] == "stand-in"




@pytest.fixture(scope="module")
def jax_training(jax_run: dict) -> tuple[dict, Path]:
    """The JAX process's training part (conftest.jax_run): the backend's phase programs on a Dense layer, then a
    training profile of the branchy model and its verification."""
    return jax_run["training"], jax_run["paths"]["training_out"]


def test_jax_training_phases_are_analysed_by_xla(jax_training: tuple[dict, Path]) -> None:
    """Each phase program of every layer, and the whole step, has XLA's FLOPs."""
    analysed = jax_training[0]["analysed"]
    assert set(analysed) == {"forward", "backward", "update", "step"}
    assert 0.5 < analysed["backward"] / analysed["forward"] < 3.5  # weight gradients; input ones where needed
    assert jax_training[0]["row_flops"] == pytest.approx(analysed["forward"] + analysed["backward"] + analysed["update"])
    ceilings = jax_training[0]["calibration"]["cpu:0"]  # the JAX device's own matmul and streaming read
    assert ceilings["matmul_flops_per_s"]["float32"] > 1e9 and ceilings["memory_bytes_per_s"] > 1e8


def test_jax_backward_scales_with_its_work_and_is_never_hoisted(jax_training: tuple[dict, Path]) -> None:
    out = jax_training[0]
    small, big = out["32"], out["512"]
    # Hoisted out of the loop, a backward would time as ~0 and not grow with the batch.
    assert big["backward"] > 4 * small["backward"]
    assert 0.8 * big["forward"] < big["backward"] < 6 * big["forward"]  # about 2x the forward's FLOPs
    assert big["backward_no_dx"] < 0.85 * big["backward"]  # an input gradient is real work: ask only when needed
    assert big["residual"] >= 512 * 512 * 4 and big["slots"] >= 2 * big["weights"]
    assert out["relu"] and out["seed_advances"] and out["later_call"] == [True, True, 0, 0]


def test_a_jax_array_already_on_its_device_is_put_there_as_it_is(jax_training: tuple[dict, Path]) -> None:
    """``device_put`` of an array already on the device took 64 µs here, on every input of every program call of a
    split's replay (a two-layer model's pass: 142-163 µs with it, 42-47 without); an array elsewhere is copied."""
    assert jax_training[0]["put"] == [True, True, True, True]


def test_a_training_profile_on_jax_is_verified_as_a_split_train_step(jax_training: tuple[dict, Path]) -> None:
    out, directory = jax_training
    p = tbs.load(directory)
    _check_training_profile(p, {"augment/random_flip", "augment/rescaling", "left", "right", "merge", "pool",
                                "join", "head_a", "head_b"})
    assert "jax.vjp" in p.metadata["training"]["backward_method"]
    assert pd.notna(p.summary.set_index("layer").loc["left", "residual_bytes"])
    assert out["verified"] == [9, 9, 2]  # every layer where it was placed; the recommendation and one device


def test_tensorflow_split_step_runs_each_backward_on_its_layers_device(two_cpus_run: dict) -> None:
    """tensorflow#33688: a gradient runs where it is called; the split step calls each one in its layer's scope.

    (The step is built in the tests' two-CPU process: conftest.SPLIT_STEP.)"""
    matmuls = two_cpus_run["split_step_matmuls"]
    on_cpu1 = [op for op in matmuls if op[1].upper().endswith("CPU:1")]
    on_cpu0 = [op for op in matmuls if op[1].upper().endswith("CPU:0")]
    # layer b on cpu:1: its forward and both gradient matmuls (kernel, input); layer a on cpu:0: forward + kernel.
    assert len(on_cpu1) == 3 and len(on_cpu0) == 2, matmuls


def test_a_subclassed_model_and_batchnorm_with_dropout_get_their_phases(subclassed_pkl: Path, custom_source: Path,
                                                                         tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["profile", str(subclassed_pkl), "--training", "--custom-objects",
                                      str(custom_source), "--batch", "4", "--out", str(tmp_path / "s"), *FAST])
    assert result.exit_code == 0, result.output
    sub = tbs.load(tmp_path / "s")
    leaves = {layer["name"] for layer in sub.metadata["layers"] if layer["category"] != "loss"}
    assert len(leaves) == 3  # dense, the custom Doubler, out
    _check_training_profile(sub, leaves)
    assert sub.metadata["training"]["loss"]["name"] == "MeanSquaredError"  # one output unit: a regression
    bn = keras.Sequential([keras.Input((6,)), layers.Dense(8, name="d"), layers.BatchNormalization(name="bn"),
                           layers.Dropout(0.5, name="drop"), layers.Dense(3, name="head")], name="bn_drop")
    p = tbs.profile(bn, [4], training=tbs.TrainingConfig(optimizer="sgd"), dataset_size=1000, timing=FAST_TIMING,
                    progress=None, report=False, measure=NO_ANALYSIS, out=tmp_path / "b")
    _check_training_profile(p, {"d", "bn", "drop", "head"}, optimizer="SGD")
    rows = p.summary.set_index("layer")
    assert rows.loc["bn", "phases"] == "forward+backward+update" and rows.loc["drop", "phases"] == "forward+backward"
    assert rows.loc["d", "slot_bytes"] < rows.loc["d", "weight_bytes"]  # plain SGD keeps no per-weight slots
    assert p.metadata["training"]["optimizer"]["source"] == "--optimizer" and p.metadata["samples"] == 1000


def test_report_shows_an_inference_and_a_training_profile_side_by_side(tmp_path: Path) -> None:
    from tbs.testing.training import fake_training_profile

    fake_training_profile(tmp_path / "t")
    fake_training_profile(tmp_path / "i", training=False)
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "i"), str(tmp_path / "t"), "-o", str(out),
                                      "--samples", "50000"])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "Inference against training" in page and "cheapest device differs" in page
    text = CliRunner().invoke(cli, ["report", str(tmp_path / "t"), str(tmp_path / "i")])
    assert text.exit_code == 0 and "embedding" in text.output


def test_a_training_group_too_big_for_memory_is_sampled_in_chunks_and_a_cell_that_cannot_fit_is_oom() -> None:
    from types import SimpleNamespace

    from tbs.measure.train_cells import memory_chunks
    from tbs.schema import CellKey

    calls = [SimpleNamespace(name=f"l{i}", input_bytes=100, output_bytes=100) for i in range(4)]  # 600 bytes each
    cap = SimpleNamespace(calls=calls)
    keys = [CellKey.of("layer", c.name, "cpu:0", 8, "training") for c in calls]
    step = CellKey.of("model", "(model)", "cpu:0", 8, "training")
    pending = {k: object() for k in keys + [step]}
    chunks, too_big = memory_chunks(pending, cap, step, free_bytes=None)
    assert chunks == [pending] and not too_big  # memory unknown: one chunk, as in inference
    chunks, too_big = memory_chunks(pending, cap, step, free_bytes=2800, step_factor=1.0)  # step: 800 bytes
    assert not too_big and list(chunks[0])[0] == step  # the step first
    assert all(sum(800 if k == step else 600 for k in c) <= 1400 or len(c) == 1 for c in chunks)
    assert sorted(k for c in chunks for k in c) == sorted(pending) and len(chunks) == 3
    chunks, too_big = memory_chunks(pending, cap, step, free_bytes=2800, step_factor=4.0)  # step: 3200 bytes
    assert list(too_big) == [step] and step not in [k for c in chunks for k in c]


def test_a_training_profile_resumes_without_measuring_finished_cells_again(tmp_path: Path) -> None:
    model = keras.Sequential([keras.Input((6,)), layers.Dense(8, name="d"), layers.Dense(3, name="head")], name="r")
    first = tbs.profile(model, [4], training=True, timing=FAST_TIMING, progress=None, report=False,
                        measure=NO_ANALYSIS, out=tmp_path / "p")
    done = first.summary.copy()
    finished = tbs.profile(model, [4, 8], training=True, timing=FAST_TIMING, progress=None, report=False,
                           measure=NO_ANALYSIS, out=tmp_path / "p", resume=True)
    assert sorted(finished.summary["batch_size"].unique()) == [4, 8]
    again = finished.summary[finished.summary["batch_size"] == 4].reset_index(drop=True)
    pd.testing.assert_frame_equal(done.reset_index(drop=True)[again.columns], again, check_dtype=False)
    assert set(finished.summary[finished.summary["batch_size"] == 8]["layer"]) == {"d", "head", LOSS_LAYER}
    assert len(finished.model) == 2
    with pytest.raises(TbsError, match="training"):  # another optimizer changes what the numbers mean
        tbs.profile(model, [4, 16], training=tbs.TrainingConfig(optimizer="sgd"), timing=FAST_TIMING, progress=None,
                    report=False, measure=NO_ANALYSIS, out=tmp_path / "p", resume=True)


def test_an_output_softmax_the_step_never_runs_is_shown_apart_and_left_out_of_the_sum() -> None:
    """Keras on TensorFlow trains a softmax output from its logits: the step runs neither the softmax nor its gradient.

    The Dense is timed up to its logits and the loss from the logits, as the step runs them; the
    softmax gets a row of its own (in_step False), shown and not summed. A separate Activation
    layer is the same case, whole. Before, nn_twins' per-layer sum was 2x its train step.
    """
    inputs = keras.Input((5,), name="x")
    hidden = layers.Dense(5, activation="relu", name="hidden")(inputs)
    split = keras.Model(inputs, layers.Dense(3, activation="softmax", name="head")(hidden))
    whole = keras.Model(inputs, layers.Activation("softmax", name="probs")(layers.Dense(3, name="logits")(hidden)))
    for model, skipped in ((split, "head (softmax)"), (whole, "probs")):
        p = tbs.profile(model, [16], training=True, timing=FAST_TIMING, progress=None, report=False,
                        measure=NO_ANALYSIS)
        s = p.summary.set_index("layer")
        assert s.loc[skipped, "in_step"] is False and s.loc[skipped, "phases"] == "forward"
        assert (s.drop(index=skipped)["in_step"] == True).all()  # noqa: E712
        summed = s.drop(index=skipped)["median_s"].sum()
        assert p.model.iloc[0]["layers_sum_s"] == pytest.approx(summed)
        entry = {layer["name"]: layer for layer in p.metadata["layers"]}[skipped]
        assert entry["in_step"] is False
        assert "‡" in tbs.render(p, "text") and "not run by the compiled train step" in tbs.render(p, "text")
    head = p.summary.set_index("layer")
    # The gradient still flows into the logits' layer: its backward runs and keeps its input alive. (Its time,
    # a Dense(5 -> 3) at batch 16 on the tests' tiny budgets, reads 0 about half the time once the harness is off.)
    assert head.loc["logits", "phases"] == "forward+backward+update" and head.loc["logits", "residual_bytes"] > 0

