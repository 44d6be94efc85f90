"""tbs diff / tbs.diff: verdicts from the raw samples, exit codes, layer matching, refusals, outputs.

Profiles of fake devices whose every call draws seeded noise (5%, lognormal) go through the real
profiler and store, so their samples.csv, summary.csv and metadata.json are what tbs writes;
the verdict's own calibration is checked on drawn samples; and two real TensorFlow profiles
(one measured, one resampled from it, with and without a planted slowdown) check the real files.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import tbs
from tbs.cli import cli
from tbs.compare import verdict as v
from tbs.errors import TbsError
from tbs.units import is_number
from tbs.testing import FakeClock, FakeDevice, FakeLayer, FakeModel, chain, fake_profile

NOISE = 0.05  # relative spread of every fake call
BASE_SCRIPT = {"dense": 1e-4, "dense_1": 1e-4}


class NoisyDevice(FakeDevice):
    """A FakeDevice whose calls each take its scripted time times a seeded lognormal factor."""

    def __init__(self, *args, seed: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(seed)

    def _runner(self, target, batch, work):
        inner = super()._runner(target, batch, 0.0)

        def runner(n: int) -> None:
            inner(n)
            self.clock.advance(n * work * float(np.exp(self.rng.normal(0.0, NOISE))))

        return runner


def noisy_profile(directory: Path, script: dict, seed: int, model: FakeModel | None = None,
                  kinds: tuple[str, ...] = ("cpu", "gpu"), batch_sizes: tuple[int, ...] = (8,), **device_options):
    clock = FakeClock()
    devices = [NoisyDevice(kind, 0, clock, script, seed=seed * 10 + i, **device_options) for i, kind in enumerate(kinds)]
    return fake_profile(directory, model or chain("dense", "dense_1"), devices, batch_sizes=batch_sizes)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diff")
    made = {
        "base": (BASE_SCRIPT, 11), "noise": (BASE_SCRIPT, 12), "slower": ({"dense": 1e-4, "dense_1": 1.3e-4}, 13),
        # 30% more on a layer that is a tenth of the model: the model is about 3% slower
        "small_layer": ({"dense": 9e-4, "dense_1": 1e-4}, 4), "small_layer_slower": ({"dense": 9e-4, "dense_1": 1.3e-4}, 5),
        "all_slower": ({"dense": 1.5e-4, "dense_1": 1.5e-4}, 14),  # a busier machine: every layer moves
    }
    for name, (script, seed) in made.items():
        noisy_profile(root / name, script, seed)
    noisy_profile(root / "cpu_only", BASE_SCRIPT, 6, kinds=("cpu",), batch_sizes=(8, 64))
    noisy_profile(root / "failing", BASE_SCRIPT, 7, failures={"dense_1": RuntimeError("boom")})
    return {name: root / name for name in [*made, "cpu_only", "failing"]}


def run(*args: str):
    return CliRunner().invoke(cli, ["diff", *map(str, args)])


def cell(d: tbs.Diff, layer: str, device: str = "cpu:0", batch: int = 8) -> pd.Series:
    rows = d.cells[(d.cells["layer"] == layer) & (d.cells["device"] == device) & (d.cells["batch_size"] == batch)]
    assert len(rows) == 1, d.cells[["layer", "device", "batch_size"]]
    return rows.iloc[0]


def test_a_planted_30_percent_slowdown_is_slower_beyond_noise_and_exits_1(fakes, loaded):
    d = tbs.diff(loaded["base"], loaded["slower"])
    for device in ("cpu:0", "gpu:0"):
        row = cell(d, "dense_1", device)
        assert row["verdict"] == "slower" and row["regression"]
        assert 0.2 < row["time_change"] < 0.4 and 0 < row["time_change_low"] < row["time_change"] < row["time_change_high"]
        assert row["confidence"] > 0.99
        whole = cell(d, "(model)", device)  # half the model 30% slower: about 15%
        assert whole["verdict"] == "slower" and whole["regression"] and 0.1 < whole["time_change"] < 0.25
        assert not cell(d, "dense", device)["regression"]  # the layer not touched: nowhere near 10%
    assert d.regressed
    result = run(fakes["base"], fakes["slower"])
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.stdout and "dense_1" in result.stdout


def test_pure_noise_says_no_change_and_exits_0(fakes, loaded):
    d = tbs.diff(loaded["base"], loaded["noise"])
    assert (d.cells["verdict"] == "no change").all(), d.cells[["layer", "device", "time_change", "p_value"]]
    assert d.cells["time_change"].abs().max() > 0  # the two runs did differ, by noise
    assert not d.regressed
    result = run(fakes["base"], fakes["noise"])
    assert result.exit_code == 0, result.output
    assert "No regression beyond 10%" in result.stdout
    assert "No layer cell changed beyond noise (4 no change); --all shows every cell" in result.stdout
    every = run(fakes["base"], fakes["noise"], "--all")
    assert every.stdout.count("no change") >= 6


def test_threshold_and_gate_decide_the_exit_code(fakes):
    assert run(fakes["base"], fakes["slower"], "--threshold", "50%").exit_code == 0  # 30% is slower, not beyond 50%
    assert run(fakes["base"], fakes["slower"], "--threshold", "50").exit_code == 0
    small = (fakes["small_layer"], fakes["small_layer_slower"])
    assert run(*small).exit_code == 1  # the layer is 30% slower
    gated = run(*small, "--gate", "model")  # the whole model about 3%: under the threshold
    assert gated.exit_code == 0, gated.output
    assert "whole model only" in gated.stdout
    assert run(fakes["base"], fakes["slower"], "--gate", "model").exit_code == 1  # there the whole model is 15% slower
    bad = run(*small, "--threshold", "ten")
    assert bad.exit_code == 2 and "--threshold" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_markdown_and_json_outputs(fakes, tmp_path):
    markdown = run(fakes["base"], fakes["slower"], "--format", "markdown")
    assert markdown.exit_code == 1
    text = markdown.stdout
    assert text.startswith("### tbs diff: fake") and "**REGRESSION:" in text
    assert "| device | batch | base | new | change | interval | verdict |" in text and "|---|" in text
    out = tmp_path / "comment.md"
    written = run(fakes["base"], fakes["slower"], "--format", "markdown", "-o", out)
    assert written.exit_code == 1 and out.read_text().startswith("### tbs diff") and "(regression)" in written.stdout
    data = json.loads(run(fakes["base"], fakes["slower"], "--format", "json").stdout)
    assert {"base", "new", "threshold", "confidence", "gate", "regressed", "regressions", "cells", "layers",
            "predicted", "devices_only", "batch_sizes_only", "notes", "different_machines"} <= set(data)
    assert data["regressed"] is True and data["threshold"] == pytest.approx(0.1)
    row = next(c for c in data["cells"] if c["layer"] == "dense_1" and c["device"] == "cpu:0")
    assert row["verdict"] == "slower" and row["regression"] is True and row["time_change_low"] > 0
    assert {"base_per_sample_s", "new_per_sample_s", "confidence", "cost_change"} <= set(row)
    assert row["cost_change"] is None  # neither side priced: blank, never 0


@pytest.fixture(scope="module")
def loaded(fakes) -> dict[str, tbs.Profile]:
    """The fake profiles read once (loading checks every CSV value: the slow part of a diff of small profiles)."""
    return {name: tbs.load(path) for name, path in fakes.items()}


def edited(profile: tbs.Profile, **changes) -> tbs.Profile:
    """The profile with metadata keys replaced (a value may be a function of the metadata), in memory."""
    meta = json.loads(json.dumps(profile.metadata))
    for key, value in changes.items():
        meta[key] = value(meta) if callable(value) else value
    return dataclasses.replace(profile, metadata=meta)


SAME_INPUTS = {"inputs": [{"name": "x", "shape": [4], "dtype": "float32"}], "input_source": "synthetic (seed 0)"}


@pytest.mark.parametrize("changes, named", [
    ({"mode": "training"}, "mode: BASE is inference, NEW is training"),
    ({"backend": "jax"}, "backend: BASE ran on fake, NEW on jax"),
    ({"xla": False}, "xla: BASE with XLA, NEW without"),
    ({"inputs": [{"name": "x", "shape": [5], "dtype": "float32"}]}, "input: BASE [4] float32, NEW [5] float32"),
    ({"inputs": [{"name": "x", "shape": [4], "dtype": "float16"}]}, "input: BASE [4] float32, NEW [4] float16"),
    ({"input_source": "data.npy"}, "input: BASE measured on synthetic inputs, NEW on your data"),
])
def test_settings_that_change_what_a_number_means_are_refused_unless_forced(loaded, changes, named):
    base = edited(loaded["base"], xla=True, **SAME_INPUTS)
    other = edited(loaded["noise"], **{"xla": True, **SAME_INPUTS, **changes})
    with pytest.raises(TbsError, match="force=True") as refused:
        tbs.diff(base, other)
    line = str(refused.value)
    assert named in line and "do not compare" in line and "\n" not in line
    forced = tbs.diff(base, other, force=True)
    assert "Compared despite different settings (--force): " + named in tbs.render(forced, "text")
    assert tbs.diff(base, edited(loaded["noise"], xla=True, **SAME_INPUTS)).notes[:1] != forced.notes[:1]


def test_a_refusal_is_one_line_and_exit_2_and_force_compares(fakes, tmp_path):
    training = tmp_path / "training"
    shutil.copytree(fakes["noise"], training)
    meta = json.loads((training / "metadata.json").read_text())
    (training / "metadata.json").write_text(json.dumps(dict(meta, mode="training")))
    refused = run(fakes["base"], training)
    assert refused.exit_code == 2 and refused.stdout == ""
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "mode: BASE is inference, NEW is training" in line and "--force" in line
    forced = run(fakes["base"], training, "--force")
    assert forced.exit_code == 0 and "Compared despite different settings (--force)" in forced.stdout


def test_input_names_alone_are_not_a_mismatch(loaded):
    base = edited(loaded["base"], inputs=[{"name": "input_layer", "shape": [4], "dtype": "float32"}])
    new = edited(loaded["noise"], inputs=[{"name": "input_layer_1", "shape": [4], "dtype": "float32"}])
    assert not tbs.diff(base, new).regressed


def test_layers_renamed_added_and_removed(tmp_path):
    base = FakeModel([FakeLayer("embed"), FakeLayer("block"), FakeLayer("drop", layer_type="Dropout", category="other"),
                      FakeLayer("head")])
    new = FakeModel([FakeLayer("embed"), FakeLayer("block_renamed"), FakeLayer("head"), FakeLayer("wider", units=6)])
    script = {name: 1e-4 for name in ("embed", "block", "drop", "head", "block_renamed", "wider")}
    d = tbs.diff(noisy_profile(tmp_path / "a", script, 1, base, kinds=("cpu",)),
                 noisy_profile(tmp_path / "b", script, 2, new, kinds=("cpu",)))
    matches = {(r["base_layer"] if isinstance(r["base_layer"], str) else None,
                r["new_layer"] if isinstance(r["new_layer"], str) else None): r["match"] for _, r in d.layers.iterrows()}
    assert matches == {("embed", "embed"): "same", ("block", "block_renamed"): "renamed", ("drop", None): "removed",
                       ("head", "head"): "same", (None, "wider"): "added"}
    renamed = cell(d, "block_renamed")
    assert renamed["base_layer"] == "block" and renamed["verdict"] == "no change"
    assert cell(d, "wider")["verdict"] == "added" and pd.isna(cell(d, "wider")["base_median_s"])
    removed = d.cells[d.cells["base_layer"] == "drop"].iloc[0]
    assert removed["verdict"] == "removed" and pd.isna(removed["new_median_s"])
    text = tbs.render(d, "text")
    assert "Layers renamed: block -> block_renamed (same type (Dense) and shapes, nearest position)" in text
    assert "Layers added: wider (Dense)" in text and "Layers removed: drop (Dropout)" in text


def test_a_name_on_another_kind_of_layer_is_not_the_same_layer(tmp_path):
    base = FakeModel([FakeLayer("a"), FakeLayer("b")])
    new = FakeModel([FakeLayer("a"), FakeLayer("b", layer_type="Conv2D", category="conv")])
    d = tbs.diff(noisy_profile(tmp_path / "a", {}, 1, base, kinds=("cpu",)),
                 noisy_profile(tmp_path / "b", {}, 2, new, kinds=("cpu",)))
    assert sorted(d.layers["match"]) == ["added", "removed", "same"]


def test_devices_and_batch_sizes_only_one_side_has(loaded):
    d = tbs.diff(loaded["base"], loaded["cpu_only"])
    assert d.devices == ["cpu:0"] and d.batch_sizes == [8]
    assert d.devices_only == {"base": ["gpu:0"], "new": []} and d.batch_sizes_only == {"base": [], "new": [64]}
    assert set(d.cells["device"]) == {"cpu:0"} and set(d.cells["batch_size"]) == {8}
    text = tbs.render(d, "text")
    assert "Devices only in BASE (not compared): gpu:0" in text and "Batch sizes only in NEW (not compared): 64" in text


def test_a_cell_failing_where_base_ran_is_a_regression(fakes, loaded):
    d = tbs.diff(loaded["base"], loaded["failing"])
    row = cell(d, "dense_1")
    assert row["verdict"] == "failed" and row["regression"] and row["status_new"] == "error"
    result = run(fakes["base"], fakes["failing"])
    assert result.exit_code == 1 and "REGRESSION: failed (error)" in result.stdout
    back = tbs.diff(loaded["failing"], loaded["base"])
    assert cell(back, "dense_1")["verdict"] == "now measured" and not back.regressed


def test_cost_is_compared_only_where_both_sides_have_a_price(fakes, loaded):
    priced_new = tbs.load(fakes["noise"], prices={"cpu:0": 1.0})
    d = tbs.diff(loaded["base"], priced_new)
    row = cell(d, "dense")
    assert pd.isna(row["base_cost_per_sample_usd"]) and row["new_cost_per_sample_usd"] > 0
    assert pd.isna(row["cost_change"])
    both = tbs.diff(loaded["base"], loaded["noise"], prices={"cpu:0": 1.0})
    row = cell(both, "dense")
    assert row["cost_change"] == pytest.approx(row["time_change"])  # one price: the cost moves with the time
    assert pd.isna(cell(both, "dense", "gpu:0")["cost_change"])  # gpu:0 has no price on either side
    assert "cost/1M base" in tbs.render(both, "text")
    dearer = tbs.diff(both_priced := tbs.load(fakes["base"], prices={"cpu:0": 1.0}),
                      tbs.load(fakes["noise"], prices={"cpu:0": 2.0}))
    assert both_priced.meta.prices_usd_per_hour["cpu:0"] == 1.0
    row = cell(dearer, "dense")
    assert row["cost_change"] == pytest.approx(2 * (1 + row["time_change"]) - 1)
    assert "Prices differ (cpu:0 $1.0/h -> $2.0/h)" in tbs.render(dearer, "text")


def test_different_machines_compare_devices_not_versions(loaded):
    def other_cpu(meta):
        return [dict(device, description="Intel Xeon (8 cores)") if device["name"] == "cpu:0" else device
                for device in meta["devices"]]

    base = edited(loaded["base"], host={"hostname": "vm", "cpu_model": "AMD EPYC", "cpu_count": 2})
    new = edited(loaded["noise"], devices=other_cpu, host={"hostname": "box", "cpu_model": "Intel Xeon", "cpu_count": 8})
    d = tbs.diff(base, new)
    assert d.different_machines
    text = tbs.render(d, "text")
    assert "this compares devices, not versions" in text and "cpu:0 is 'fake cpu' in BASE and 'Intel Xeon (8 cores)'" in text
    d = tbs.diff(base, edited(loaded["noise"], host={"hostname": "ci-17", "cpu_model": "AMD EPYC"}))
    assert not d.different_machines and "different hosts with the same hardware" in tbs.render(d, "text")


def test_predicted_cells_are_compared_only_with_predicted_ones(loaded):
    def with_predictions(p: tbs.Profile, seconds: float) -> tbs.Profile:
        rows = [dict(target="layer", layer="dense", layer_type="Dense", category="dense", device="h100",
                     device_kind="gpu", batch_size=8, mode="inference", source="predicted", method="roofline",
                     median_s=seconds, low_s=seconds * 0.8, high_s=seconds * 1.2, per_sample_s=seconds / 8)]
        return dataclasses.replace(p, predictions=pd.DataFrame(rows).reindex(columns=p.predictions.columns))

    d = tbs.diff(with_predictions(loaded["base"], 1e-5), with_predictions(loaded["noise"], 2e-5))
    assert "h100" not in set(d.cells["device"])  # never beside the measured cells
    assert len(d.predicted) == 1 and d.predicted.iloc[0]["verdict"] == "predicted"
    assert d.predicted.iloc[0]["time_change"] == pytest.approx(1.0)
    assert "Predicted cells (not measured" in tbs.render(d, "text")
    one_side = tbs.diff(loaded["base"], with_predictions(loaded["noise"], 2e-5))
    assert one_side.predicted.empty


def test_bad_arguments_are_one_line(fakes, loaded, tmp_path):
    missing = run(fakes["base"], tmp_path / "nothing")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    for kwargs, fragment in (({"threshold": -1}, "threshold=-1"), ({"confidence": 2}, "confidence=2"),
                             ({"gate": "layers"}, "gate='layers'"), ({"force": "yes"}, "force='yes'")):
        with pytest.raises(TbsError, match=fragment.replace("(", r"\(")):
            tbs.diff(loaded["base"], loaded["noise"], **kwargs)
    with pytest.raises(TbsError, match="text, markdown, json"):
        tbs.render(tbs.diff(loaded["base"], loaded["noise"]), "html")


def test_the_verdict_is_calibrated_on_drawn_samples():
    """Null pairs of 10-15 samples: about 5% under p < 0.05 each, the tail no heavier (the normal reference put
    8 of 300 under p < 0.01 on this seed), none changed after the correction; a 30% change is found."""
    rng = np.random.default_rng(7)
    p_values, found = [], 0
    for _ in range(300):
        n_a, n_b = rng.integers(10, 16, size=2)
        a, b = rng.lognormal(0, NOISE, n_a), rng.lognormal(0, NOISE, n_b)
        error = v.log_ratio_error({"forward": a}, {"forward": b})
        p_values.append(v.change_interval(float(np.median(a)), float(np.median(b)), error, 0.95, min(n_a, n_b))[3])
    for _ in range(50):
        a, c = rng.lognormal(0, NOISE, 10), rng.lognormal(np.log(1.3), NOISE, 10)
        error = v.log_ratio_error({"forward": a}, {"forward": c})
        change, low, _, p = v.change_interval(float(np.median(a)), float(np.median(c)), error, 0.95, 10)
        found += p < 0.001 and low > 0.15
    p_values = np.array(p_values)
    assert np.mean(p_values < 0.05) < 0.07 and np.sum(p_values < 0.01) <= 4
    assert all(v.verdict(0.01, q, 0.95) == v.NO_CHANGE for q in v.adjusted(list(p_values)))
    assert found >= 48  # a 30% change at 5% noise and 10 samples: found nearly always, with its interval above 15%


def test_a_training_row_sums_its_phases():
    phases = {"forward": np.ones(5), "forward+backward": np.full(5, 3.0), "update": np.ones(5), "overlapped": np.ones(5)}
    assert sorted(v.row_phases(phases)) == ["forward+backward", "update"]
    assert v.log_ratio_error(v.row_phases(phases), v.row_phases(phases)) == 0.0


def redrawn(profile: tbs.Profile, directory: Path, draw, slower: dict[str, float] | None = None) -> Path:
    """Another run of ``profile`` made of its own raw samples, each cell's drawn by ``draw(values)`` and each
    layer in ``slower`` that much slower, with its medians recomputed from them; saved as a profile."""
    slower = slower or {}
    samples = profile.samples.copy()
    medians = {}
    for key, group in samples.groupby(["target", "layer", "device", "batch_size", "phase"]):
        drawn = draw(group["seconds_per_call"].to_numpy()) * slower.get(key[1], 1.0)
        samples.loc[group.index, "seconds_per_call"] = drawn
        medians[key[:4]] = float(np.median(drawn))

    def redone(frame: pd.DataFrame, target: str) -> pd.DataFrame:
        frame = frame.copy()
        keys = [(target, r.get("layer", "(model)"), r["device"], r["batch_size"]) for r in frame.to_dict("records")]
        frame["median_s"] = [medians.get(k, m) for k, m in zip(keys, frame["median_s"])]
        frame["per_sample_s"] = frame["median_s"] / frame["batch_size"]
        frame["cost_per_sample_usd"] = frame["per_sample_s"] * frame["usd_per_hour"] / 3600
        return frame

    again = dataclasses.replace(profile, samples=samples, summary=redone(profile.summary, "layer"),
                                model=redone(profile.model, "model"))
    return again.save(directory)


@pytest.fixture(scope="module")
def real_profile(tmp_path_factory) -> tbs.Profile:
    """A real TensorFlow profile of three Dense(512) layers, each measured on its own."""
    from keras_models import mlp_model

    timing = tbs.TimingConfig(min_samples=5, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
    return tbs.profile(mlp_model(), batch_sizes=[16], prices={"cpu": 0.5}, timing=timing, progress=None, report=False,
                       measure=tbs.MeasureConfig(analysis=False, dedupe=False),
                       out=tmp_path_factory.mktemp("real") / "base")


def test_real_profiles_redrawn_say_no_change_and_a_planted_slowdown_is_measured(real_profile, tmp_path):
    """On real files: a run drawn again from the same samples is no change; the slowest layer's every sample 30%
    longer is a 30% change, called slower exactly when its interval clears 0 (this machine's noise decides that)."""
    rng = np.random.default_rng(1)
    noise = redrawn(real_profile, tmp_path / "noise", lambda values: rng.choice(values, size=len(values)))
    d = tbs.diff(real_profile, noise)
    assert d.cells["verdict"].isin(["no change", "below resolution"]).all(), d.cells[["layer", "time_change", "p_value"]]
    assert run(real_profile.directory, noise).exit_code == 0
    layers = real_profile.summary.set_index("layer")["median_s"]
    planted = str(layers.idxmax())
    if not layers[planted] > 0:
        pytest.skip("this machine's load left every layer below the harness's resolution")
    slower = redrawn(real_profile, tmp_path / "slower", lambda values: values, slower={planted: 1.3})
    d = tbs.diff(real_profile, slower)
    row = cell(d, planted, "cpu:0", 16)
    assert row["time_change"] == pytest.approx(0.3) and row["cost_change"] == pytest.approx(0.3)
    if is_number(row["time_change_low"]):
        assert row["time_change_low"] < 0.3 < row["time_change_high"]
    # slower only with the whole interval above 0; the verdict is also corrected across cells, so an interval that
    # just clears 0 may still read no change (the interval is the cell's own)
    if row["verdict"] == "slower":
        assert row["time_change_low"] > 0
    if row["time_change_low"] <= 0:
        assert row["verdict"] == "no change"
    assert row["regression"] == (row["verdict"] == "slower")
    assert d.cells.loc[d.cells["layer"] != planted, "verdict"].isin(["no change", "below resolution"]).all()
    result = run(real_profile.directory, slower, "--format", "markdown", "--all")
    assert result.exit_code == (1 if row["regression"] else 0) and f"| {planted} | cpu:0 | 16 |" in result.stdout


def test_a_training_row_is_judged_from_its_phases_samples(tmp_path):
    from tbs.testing.training import TRAINING_SECONDS, fake_training_profile

    dense = TRAINING_SECONDS["cpu:0"]["dense"]
    slower_backward = {**TRAINING_SECONDS, "cpu:0": {**TRAINING_SECONDS["cpu:0"],
                                                     "dense": (dense[0], lambda b: 1.5 * dense[1](b), dense[2])}}
    base = fake_training_profile(tmp_path / "a")
    d = tbs.diff(base, fake_training_profile(tmp_path / "b", seconds=slower_backward))
    row = cell(d, "dense", "cpu:0", 64)
    forward, backward, update = dense[0](64), dense[1](64), dense[2]
    assert row["time_change"] == pytest.approx((forward + 1.5 * backward + update) / (forward + backward + update) - 1)
    assert row["verdict"] == "slower" and row["regression"] and row["time_change_low"] > 0
    assert cell(d, "head", "cpu:0", 64)["verdict"] == "no change"  # the same samples on both sides
    assert cell(d, "(loss)", "cpu:0", 64)["verdict"] == "no change"
    assert cell(d, "(model)", "cpu:0", 64)["verdict"] == "no samples"  # the fake train step keeps none
    inference = fake_training_profile(tmp_path / "c", training=False)
    with pytest.raises(TbsError, match="mode: BASE is training, NEW is inference"):
        tbs.diff(base, inference)


def test_a_cell_one_side_lacks_and_a_shared_row_judged_from_its_representative(loaded):
    new = loaded["noise"]
    summary = new.summary[~((new.summary["layer"] == "dense") & (new.summary["device"] == "gpu:0"))]
    d = tbs.diff(loaded["base"], dataclasses.replace(new, summary=summary))  # as an interrupted run leaves it
    assert cell(d, "dense", "gpu:0")["verdict"] == "only in base" and not d.regressed
    # dense_1 measured once as dense's twin (tbs profile's dedupe): its samples are dense's
    shared = new.summary.copy()
    twin = shared["layer"] == "dense_1"
    for column in ("median_s", "per_sample_s", "n"):
        shared.loc[twin, column] = shared.loc[shared["layer"] == "dense", column].to_numpy()
    shared["shared_with"] = shared["shared_with"].astype(object)
    shared.loc[twin, "shared_with"] = "dense"
    samples = new.samples[new.samples["layer"] != "dense_1"]
    d = tbs.diff(loaded["base"], dataclasses.replace(new, summary=shared, samples=samples))
    row, representative = cell(d, "dense_1"), cell(d, "dense")
    assert row["verdict"] == representative["verdict"] != "no samples"
    assert row["p_value"] != representative["p_value"]  # each against its own BASE row


def test_every_layer_moving_together_is_said_to_be_the_machine_more_likely(loaded):
    d = tbs.diff(loaded["base"], loaded["all_slower"])
    assert d.regressed  # the verdicts stand: the samples say slower
    assert any(note.startswith("Every layer moved together (100% of the 4 layer cells tested") for note in d.notes)
    assert not any("moved together" in note for note in tbs.diff(loaded["base"], loaded["slower"]).notes)
    assert not any("moved together" in note for note in tbs.diff(loaded["base"], loaded["noise"]).notes)
