"""Predictions for devices tbs did not measure, the device catalog, and device memory as a hard limit.

On hand-built profiles (no measuring): predicted rows are labelled, kept out of ``summary``,
priced from the catalog, left out of a recommendation unless asked for; the catalog never
turns a blank or a sentinel into a number; the largest-batch search records failures.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import tbs
from tbs.cli import cli
from tbs.errors import TbsError
from tbs.measure.capacity import search
from tbs.measure.transfers import TransferFit
from tbs.predictions.catalog import load_catalog, resolve
from test_roofline_report import make_profile

CATALOG_COLUMNS = ("peak_float32_flops_per_s", "peak_bfloat16_flops_per_s", "memory_bytes",
                   "memory_bandwidth_bytes_per_s", "usd_per_hour", "spot_usd_per_hour")


def cpu_only() -> tbs.Profile:
    """The toy profile measured on cpu:0 alone, with the layers' sizes placement needs."""
    p = make_profile(predicted=False)
    summary, model = (f[f["device"] == "cpu:0"].reset_index(drop=True) for f in (p.summary, p.model))
    metadata = dict(p.metadata, devices=[{"name": "cpu:0", "kind": "cpu", "memory_bytes": 64 * 2**30}])
    metadata.pop("prediction")
    summary["usd_per_hour"] = 0.5
    return replace(p, summary=summary, model=model, metadata=metadata)


def test_the_catalog_has_no_zeros_and_knows_which_peak_a_float32_matmul_gets():
    catalog = load_catalog()
    assert {"t4", "l4", "a100-80gb", "h100", "h200", "tpu-v5e", "tpu-v6e"} <= set(catalog)
    for device in catalog.values():
        values = [*device.peaks_flops_per_s.values(), device.memory_bytes, device.memory_bandwidth_bytes_per_s,
                  device.usd_per_hour, device.spot_usd_per_hour]
        assert all(v is None or v > 0 for v in values), device.id
    assert catalog["tpu-v5e"].matmul_peak("float32") == catalog["tpu-v5e"].peaks_flops_per_s["bfloat16"]
    assert catalog["h100"].matmul_peak("float32") == catalog["h100"].peaks_flops_per_s["tf32"]
    assert catalog["t4"].matmul_peak("float32") == catalog["t4"].peaks_flops_per_s["float32"]  # Turing: no TF32
    with pytest.raises(TbsError, match="'nope' is not in the device catalog; choose from .*h100"):
        resolve("h100,nope", catalog)


def test_a_catalog_sentinel_or_blank_is_never_a_price(tmp_path: Path):
    shipped = pd.read_csv(Path(tbs.__file__).parent / "predictions" / "catalog.csv")
    rows = shipped[shipped["id"].isin(["t4", "l4"])].copy()
    rows.loc[rows["id"] == "t4", "usd_per_hour"] = 700.0  # a feed's "not offered here"
    rows.loc[rows["id"] == "l4", "usd_per_hour"] = None
    rows.to_csv(tmp_path / "catalog.csv", index=False)
    catalog = load_catalog(str(tmp_path / "catalog.csv"))
    assert catalog["t4"].usd_per_hour is None and catalog["l4"].usd_per_hour is None
    p = tbs.predict(cpu_only(), "t4,l4", catalog=tmp_path / "catalog.csv")
    assert p.predictions["cost_per_sample_usd"].isna().all()  # blank, never 0


def test_predictions_are_labelled_banded_priced_and_kept_apart():
    measured = cpu_only()
    p = tbs.predict(measured, ["h100", "tpu-v5e"])
    pd.testing.assert_frame_equal(p.summary, measured.summary)  # nothing measured changes
    rows = p.predictions
    assert set(rows["source"]) == {"predicted"} and set(rows["device"]) == {"h100", "tpu-v5e"}
    timed = rows[rows["median_s"].notna()]
    assert (timed["low_s"] < timed["median_s"]).all() and (timed["median_s"] < timed["high_s"]).all()
    on_gpu = timed["device"] == "h100"
    assert timed.loc[on_gpu, "method"].str.startswith("GPU model (published measurements)").all()
    assert timed.loc[~on_gpu, "method"].str.startswith("roofline scaling from cpu:0").all()
    assert timed.loc[~on_gpu, "method"].str.contains("datasheet only").all()  # no TPU measurement backs it
    assert set(rows.loc[rows["median_s"].isna(), "layer"]) == {"flatten"}  # no FLOPs counted: not predicted
    assert rows.loc[rows["median_s"].isna(), "reason"].str.startswith("not predicted").all()
    conv = rows[(rows["layer"] == "conv") & (rows["device"] == "h100") & (rows["batch_size"] == 32)].iloc[0]
    cpu_conv = measured.summary.query("layer == 'conv' and batch_size == 32")["median_s"].iloc[0]
    assert conv["median_s"] < cpu_conv / 10  # a compute-bound conv on an H100: far faster than 2 CPU cores
    price = load_catalog()["h100"].usd_per_hour
    assert conv["cost_per_sample_usd"] == pytest.approx(conv["per_sample_s"] * price / 3600)
    repriced = tbs.predict(measured, "h100", prices="h100=2")
    assert (repriced.predictions["usd_per_hour"] == 2.0).all()
    with pytest.raises(TbsError, match="--from: 'gpu:3' was not measured in this profile; choose from cpu:0"):
        tbs.predict(measured, "h100", source="gpu:3")


def test_recommend_leaves_predicted_devices_out_unless_asked():
    p = tbs.predict(cpu_only(), "tpu-v5e")
    plain = tbs.recommend(p, "time")
    assert set(plain.placement["device"]) == {"cpu:0"} and "left out (tpu-v5e)" in plain.predicted_note
    assert "left out" in tbs.render(None, "text", recommendation=plain)
    mixed = tbs.recommend(p, "time", include_predicted=True)
    assert "includes predicted devices (tpu-v5e" in mixed.predicted_note
    placed = dict(zip(mixed.placement["layer"], mixed.placement["device"]))
    assert placed["conv"] == "tpu-v5e" and placed["flatten"] == "cpu:0"  # flatten has no prediction: it stays measured
    assert "all on tpu-v5e" not in {e.name for e in mixed.single_devices}  # not every layer has a prediction
    with pytest.raises(TbsError, match="predicted devices cannot be run here"):
        tbs.recommend(p, "time", include_predicted=True, verify=True)
    # Which layers rest on a prediction, and whether their band could move them
    rests = {r["layer"]: r for r in mixed.prediction_dependence}
    assert rests["conv"]["device_predicted"] and "conv" in rests
    assert all(r["at_band_low"] and r["at_band_high"] for r in rests.values())
    assert "Layers resting on a prediction" in tbs.render(None, "text", recommendation=mixed)
    assert plain.prediction_dependence == []


def test_the_band_of_a_close_call_can_flip_a_placement():
    measured = cpu_only()
    p = tbs.predict(measured, "h100")
    rows = p.predictions
    cpu_pool = measured.summary.query("layer == 'pool' and batch_size == 32")["median_s"].iloc[0]
    at = (rows["layer"] == "pool") & (rows["batch_size"] == 32)
    # the pool's prediction a hair under the CPU's time, its band wide around it: the band could flip it
    rows.loc[at, ["median_s", "low_s", "high_s"]] = [cpu_pool * 0.9, cpu_pool * 0.3, cpu_pool * 3]
    rec = tbs.recommend(dataclasses.replace(p, predictions=rows), "time", batch_size=32, include_predicted=True)
    pool = next(r for r in rec.prediction_dependence if r["layer"] == "pool")
    assert pool["device"] == "h100" and pool["could_flip"] and pool["at_band_high"] == "cpu:0"


def test_device_memory_is_a_hard_limit_on_placement():
    p = make_profile(predicted=False)
    layers = [dict(l, params=0, input_bytes=1e6, output_bytes=1e6, batch_size=8) for l in p.metadata["layers"]]
    layers[0]["params"] = 10**9  # conv: 4 GB of weights
    devices = [{"name": "cpu:0", "kind": "cpu", "memory_bytes": 64 * 2**30},
               {"name": "gpu:0", "kind": "gpu", "memory_bytes": 2 * 2**30}]
    p = replace(p, metadata=dict(p.metadata, layers=layers, devices=devices,
                                 transfers={"cpu:0->gpu:0": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10},
                                            "gpu:0->cpu:0": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10}},
                                 host_device="cpu:0"))
    rec = tbs.recommend(p, "time", batch_size=8)
    placed = dict(zip(rec.placement["layer"], rec.placement["device"]))
    assert placed["conv"] == "cpu:0" and placed["pool"] == "gpu:0"  # gpu:0 is 10x faster, but conv does not fit
    assert "all on gpu:0" not in {e.name for e in rec.single_devices}


def test_tbs_predict_writes_predictions_beside_the_profile(tmp_path: Path):
    directory = cpu_only().save(tmp_path / "toy")
    runner = CliRunner()
    done = runner.invoke(cli, ["predict", str(directory), "--device", "h100,tpu-v5e"])
    assert done.exit_code == 0, done.output
    assert "Predicted (not measured)" in done.output
    # Per layer, the measured device beside each predicted one, with its band and price; the
    # measured table is not printed again (no "cheapest" column of the console report).
    header = next(line for line in done.output.splitlines() if "measured" in line and "predicted [90%]" in line)
    assert "cpu:0 measured" in header and "h100 predicted [90%]" in header and "tpu-v5e $/1M" in header
    layers = set(cpu_only().summary["layer"])
    rows = [line.split()[0] for line in done.output.splitlines() if line.split() and line.split()[0] in layers]
    assert set(rows) == layers and len(rows) == len(layers) * 2  # each layer once per batch size
    assert " – " in done.output and "fastest" not in done.output.lower()
    saved = pd.read_csv(directory / "predictions.csv")
    assert set(saved["device"]) == {"h100", "tpu-v5e"}
    assert set(tbs.load(directory).predictions["device"]) == {"h100", "tpu-v5e"}
    bad = runner.invoke(cli, ["predict", str(directory), "--device", "h1000"])
    assert bad.exit_code == 2 and "'h1000' is not in the device catalog" in bad.output
    assert "Traceback" not in bad.output


class Memory:
    """A device whose calls fail above a batch size and whose peak grows with it (no framework)."""

    kind, name = "cpu", "cpu:0"

    def __init__(self, fails_above: int) -> None:
        self.fails_above, self.peak = fails_above, 0

    def peak_memory_bytes(self, reset: bool = False) -> int:
        if reset:
            self.peak = 1000
        return self.peak

    def run(self, batch: int) -> None:
        if batch > self.fails_above:
            raise MemoryError(f"out of memory at batch {batch}")
        self.peak = 1000 + 100 * batch


def test_the_largest_batch_search_records_a_failure_and_never_raises():
    device = Memory(fails_above=300)
    found = search(device.run, device, 16, budget_bytes=1e9, seconds_per_sample=None, ceiling=2**20)
    assert found["confirmed_batch"] == 256  # 16, 32, ... 256 ran; 512 failed
    assert found["tries"][-1] == {"batch_size": 512, "ok": False, "oom": True,
                                  "reason": "MemoryError: out of memory at batch 512"}
    roomy = Memory(fails_above=10**9)
    found = search(roomy.run, roomy, 16, budget_bytes=100 * 5000, seconds_per_sample=None, ceiling=2**20)
    assert found["confirmed_batch"] == 4000  # 80% of the budget at 100 bytes a sample, reached in real calls
    assert all(t["ok"] for t in found["tries"]) and found["tries"][-1]["batch_size"] == 4000


def test_largest_batch_under_a_memory_limit_runs_and_a_batch_well_above_it_fails_recorded(tmp_path: Path):
    """This machine's CPU with a data-size limit set for the test (RLIMIT_DATA), through the real CLI."""
    import json
    import os
    import pickle
    import subprocess
    import sys

    from conftest import ROOT
    from keras_models import keras, layers

    inputs = keras.Input((16,), name="x")
    wide = layers.Dense(8192, activation="relu", name="wide")(inputs)  # 32 KiB of activations a sample, few FLOPs
    model = keras.Model(inputs, layers.Dense(1, name="out")(wide), name="wide")
    with open(tmp_path / "wide.pkl", "wb") as f:
        pickle.dump(model, f)
    # The child starts TensorFlow, sets its data-size limit to TensorFlow's own data segment (its threads
    # included) plus 1.5 GiB, and runs the CLI in that process (no fork of this multithreaded one).
    limited = ("import pathlib, resource, runpy, sys; import tensorflow as tf; tf.constant(1.0) + 1; "
               "data = 1024 * int(next(l.split()[1] for l in pathlib.Path('/proc/self/status').read_text()"
               ".splitlines() if l.startswith('VmData:'))); limit = data + 3 * 2**29; "
               "resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)); sys.argv = ['tbs', *sys.argv[1:]]; "
               "runpy.run_module('tbs', run_name='__main__')")

    def run(batch: str, out: str, *extra: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        return subprocess.run([sys.executable, "-c", limited, "profile", str(tmp_path / "wide.pkl"), "--batch", batch,
                               "--devices", "cpu:0", "--out", str(tmp_path / out), "--min-samples", "3",
                               "--max-cell-seconds", "0.05", "--min-span-seconds", "0", "--no-analysis", *extra],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)

    # 512 fits; 200,000 (6 GiB of activations) cannot: one run measures one, refuses the other, and searches
    done = run("512,200000", "fits", "--capacity")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    found = json.loads((tmp_path / "fits" / "metadata.json").read_text())["capacity"]["cpu:0"]
    largest = found["largest_batch"]
    assert largest and 512 < largest <= 200000 / 4 and not found["capped"] and found["limit_bytes"] < 3 * 2**29
    ran = [t for t in found["tries"] if t["batch_size"] == largest]
    assert ran and ran[-1]["ok"] and ran[-1]["peak_bytes"] < found["limit_bytes"]  # confirmed by a real call
    cells = pd.concat([pd.read_csv(tmp_path / "fits" / f) for f in ("summary.csv", "model.csv")])
    assert set(cells.loc[cells["batch_size"] == 512, "status"]) <= {"ok", "noisy"}
    big = cells[cells["batch_size"] == 200000]  # well above it: recorded, not crashed
    assert len(big) == 3 and set(big["status"]) == {"oom"} and big["reason"].str.contains("GiB").all()
    assert "largest batch that fits" in done.stdout


def test_a_layer_fit_separates_its_fixed_overhead_from_its_work():
    from tbs.predictions.predictor import Ceilings, fit_layer, predict_seconds

    points = [(r, 5e-6 + 2.0 * r) for r in (1e-6, 4e-6, 16e-6)]  # 5 µs of overhead, half the roofline's speed
    fit = fit_layer(points)
    assert fit.overhead_s == pytest.approx(5e-6, rel=1e-3) and fit.per_roofline == pytest.approx(2.0, rel=1e-3)
    assert fit_layer(points[:1]) is None  # one batch size: nothing to fit
    cpu, faster = Ceilings(1e11, 1e11, 1e10), Ceilings(1e13, 1e13, 1e12)
    work = (1e6, 1e3)  # 10 µs of compute on cpu, 0.1 µs on the faster device
    assert predict_seconds(25e-6, work, cpu, faster, True, True, fit) == pytest.approx(5e-6 + 2 * 1e-7)
    assert predict_seconds(25e-6, work, cpu, faster, True, False, fit) == pytest.approx(2 * 1e-7)  # another kind


def test_json_keeps_predicted_cells_apart_from_measured_ones():
    import json

    out = json.loads(tbs.render(tbs.predict(cpu_only(), "h100"), "json"))
    assert {r["device"] for r in out["layers"]} == {"cpu:0"} and {r["device"] for r in out["fastest"]} <= {"cpu:0"}
    assert {r["device"] for r in out["predicted"]} == {"h100"} and all(r["source"] == "predicted" for r in out["predicted"])
    assert "predicted" not in json.loads(tbs.render(cpu_only(), "json"))


def test_review_fixes_memory_line_catalog_match_and_prices():
    from tbs.measure.capacity import largest_batch, training_points
    from tbs.predictions.predictor import catalog_match

    assert largest_batch((5e9, 0.0), 4e9) is None  # fixed memory alone exceeds the device
    rows = pd.DataFrame({"batch_size": [8, 8], "status": ["ok", "oom"], "weight_bytes": [10, None],
                         "slot_bytes": [20, None], "residual_bytes": [30, None]})
    assert training_points(rows) == []  # a failed layer leaves the point out, never counts as 0 bytes
    assert training_points(pd.DataFrame({"batch_size": [8], "status": ["oom"]})) == []
    catalog = load_catalog()
    assert catalog_match("NVIDIA A100-SXM4-80GB", "gpu", catalog).id == "a100-80gb"
    assert catalog_match("NVIDIA L40S", "gpu", catalog) is None and catalog_match("TPU v4", "tpu", catalog).id == "tpu-v4"
    p = tbs.predict(cpu_only(), "h200,h100")  # the catalog has no H200 price
    rec = tbs.recommend(p, "cost", prices="cpu=0.5,gpu=3", include_predicted=True)
    assert rec.inputs.usd_per_hour["h200"] is None and rec.inputs.usd_per_hour["h100"] == load_catalog()["h100"].usd_per_hour


def test_a_calibration_that_fails_is_recorded_and_the_run_goes_on():
    from tbs.backends.base import CalibrationProgram
    from tbs.measure.calibrate import calibrate
    from tbs.measure.timing import Timer, TimingConfig

    class Small:
        backend, name = "fake", "cpu:9"

        def calibration_programs(self, dtype):
            def runner(n):
                raise MemoryError("cannot allocate the 256 MiB buffer")
            return [CalibrationProgram("stream", dtype, runner, 0.0, 2.0**28)]

    found = calibrate(Small(), ["float32"], Timer(TimingConfig(min_samples=3)), lambda n: None)
    assert found["memory_bytes_per_s"] is None and "MemoryError" in found["failed"]["stream float32"]


def test_a_device_that_cannot_be_predicted_saves_rows_the_profile_still_loads_with(tmp_path):
    """No calibration on the source (a --no-analysis profile): each batch's whole-model row says why, and
    the saved profile still loads and reports (a blank layer name used to make it read as damaged)."""
    from tbs.testing import FakeClock, FakeDevice, chain, fake_profile

    clock = FakeClock()
    fake_profile(tmp_path / "p", chain("dense", "dense_1"), [FakeDevice("cpu", 0, clock, {"dense": 1e-4})],
                 batch_sizes=(8, 64))
    runner = CliRunner()
    result = runner.invoke(cli, ["predict", str(tmp_path / "p"), "--device", "tpu-v5e", "--from", "cpu:0"])
    assert result.exit_code == 0, result.output
    saved = tbs.load(tmp_path / "p").predictions
    assert list(saved["batch_size"]) == [8, 64] and set(saved["layer"]) == {"(model)"}
    assert saved["reason"].str.contains("not predicted: cpu:0 has no calibration").all()
    report = runner.invoke(cli, ["report", str(tmp_path / "p"), "--format", "text"])
    assert report.exit_code == 0, report.output


def test_a_devices_matmul_and_stream_are_sampled_together_and_share_one_minimum_span():
    """Calibrated one after the other, each program waited out its own 2 s span: 4 s of every profile."""
    from tbs.backends.base import CalibrationProgram
    from tbs.measure.calibrate import calibrate
    from tbs.measure.timing import Timer, TimingConfig

    now = [0.0]

    def program(name: str, seconds: float) -> CalibrationProgram:
        def runner(n: int) -> None:
            now[0] += n * seconds
        return CalibrationProgram(name, "float32", runner, 2e9, 1e9)

    class Steady:
        backend, name = "fake", "cpu:8"

        def calibration_programs(self, dtype):
            return [program("matmul", 0.02), program("stream", 0.01)]

    config = TimingConfig(min_samples=3, min_block_seconds=0.01, min_span_seconds=2.0)
    found = calibrate(Steady(), ["float32"], Timer(config, clock=lambda: now[0]), lambda n: None)
    assert found["matmul_flops_per_s"]["float32"] == pytest.approx(1e11)
    assert found["memory_bytes_per_s"] == pytest.approx(1e11)
    assert now[0] < 2.6, now[0]  # one span of about 2 s for both, not 2 s each


def branching(p: tbs.Profile) -> tbs.Profile:
    """The toy profile with a branching graph (conv feeds pool and flatten): no chain, so three devices go to HiGHS."""
    edges = {str(b): [dict(src=s, dst=d, shape=[b, 4], dtype="float32", bytes=16 * b)
                      for s, d in (("/input/x", "conv"), ("conv", "pool"), ("conv", "flatten"), ("pool", "flatten"),
                                   ("flatten", "/output"))] for b in (8, 32)}
    return replace(p, metadata=dict(p.metadata, graph=edges, host_device="cpu:0"))


def test_two_predicted_devices_on_a_branching_model_get_a_placement_not_a_solver_traceback():
    """Issue 30 item 5: a100-40gb and t4 predicted on a DAG. No copy between the two predicted GPUs was
    ever timed and pool has no prediction on t4; both reached HiGHS as infinite costs (a scipy traceback)."""
    p = tbs.predict(branching(cpu_only()), "a100-40gb,t4")
    rows = p.predictions.copy()
    rows.loc[(rows["layer"] == "pool") & (rows["device"] == "t4"), ["median_s", "low_s", "high_s", "reason"]] = \
        [None, None, None, "not predicted: no kernel for it (test)"]
    p = replace(p, predictions=rows)
    for objective in ("time", "cost"):
        rec = tbs.recommend(p, objective, batch_size=32, include_predicted=True)
        placed = dict(zip(rec.placement["layer"], rec.placement["device"]))
        assert rec.method.startswith("integer program") and placed["pool"] != "t4"  # no prediction: not there
        assert placed["conv"] in ("a100-40gb", "t4") and math.isfinite(rec.chosen.seconds_per_batch)
        used = set(placed.values()) - {"cpu:0"}
        assert len(used) == 1  # a100-40gb <-> t4 was never timed: no tensor crosses between them
        assert rec.inputs.why_not[("pool", "t4")] == "not predicted: no kernel for it (test)"


def test_a_layer_no_timed_copy_can_reach_is_one_line_naming_it(tmp_path: Path):
    p = tbs.predict(branching(cpu_only()), "a100-40gb,t4")
    s, rows = p.summary.copy(), p.predictions.copy()
    for layer, lacks in (("conv", "t4"), ("pool", "a100-40gb")):  # conv only on a100-40gb, pool only on t4
        s.loc[(s["layer"] == layer) & (s["batch_size"] == 32), ["status", "median_s"]] = ["oom", None]
        rows.loc[(rows["layer"] == layer) & (rows["device"] == lacks), ["median_s", "low_s", "high_s"]] = None
    directory = replace(p, summary=s, predictions=rows).save(tmp_path / "toy")
    done = CliRunner().invoke(cli, ["recommend", str(directory), "--include-predicted", "--batch", "32",
                                    "--objective", "time"])
    assert done.exit_code == 2 and "Traceback" not in done.output, done.output
    line = done.output.strip().splitlines()[-1]
    assert re.search(r"layer '(conv|pool)' cannot be placed at batch 32: it can go only on (a100-40gb|t4) and "
                     r"'(pool|conv)', which it (feeds|reads), only on (t4|a100-40gb), and no copy between those "
                     r"devices was timed", line), line


def test_a_price_for_a_predicted_device_by_its_catalog_id(tmp_path: Path):
    directory = tbs.predict(cpu_only(), "t4").save(tmp_path / "toy")
    runner = CliRunner()
    done = runner.invoke(cli, ["recommend", str(directory), "--include-predicted", "--cost", "t4=0.53",
                               "--format", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["inputs"]["usd_per_hour"]["t4"] == 0.53
    rec = tbs.recommend(directory, "cost", prices={"t4": 0.53}, include_predicted=True)  # a mapping, as in Python
    assert rec.inputs.usd_per_hour["t4"] == 0.53
    prices = tmp_path / "prices.csv"
    prices.write_text("device,price,source,date\nt4,0.53,https://example.com,2026-11-26\n")
    assert tbs.load(directory, price_file=prices).predictions["usd_per_hour"].eq(0.53).all()
    for bad in (["--cost", "t5=0.53"], ["--cost", "zz9=1"]):  # neither measured nor in the catalog
        refused = runner.invoke(cli, ["recommend", str(directory), "--include-predicted", *bad])
        assert refused.exit_code == 2 and "unknown device" in refused.output and "Traceback" not in refused.output
    with pytest.raises(TbsError, match="unknown device 't5'"):
        tbs.recommend(directory, "cost", prices={"t5": 0.53})


def test_without_batch_recommend_takes_the_largest_batch_with_every_layer_timed():
    """The largest profiled batch ran out of memory on the CPU: recommend places the largest batch that has
    a time for every layer, and says so (it used to take 32 and fail on its first layer)."""
    p = cpu_only()
    s = p.summary.copy()
    s["reason"] = s["reason"].astype(object)
    s.loc[s["batch_size"] == 32, ["status", "median_s", "reason"]] = ["oom", None, "out of memory"]
    p = replace(p, summary=s)
    rec = tbs.recommend(p, "time")
    assert rec.batch_size == 8
    assert rec.inputs.batch_note == ("batch 8: the largest batch with a time for every layer (batch 32 has no "
                                     "time for 3 of 3 layers: oom); pick another with --batch")
    assert f"Note: {rec.inputs.batch_note}" in tbs.render(None, "text", recommendation=rec)
    assert json.loads(tbs.render(None, "json", recommendation=rec))["batch_note"] == rec.inputs.batch_note
    assert tbs.recommend(cpu_only(), "time").inputs.batch_note == ""  # the largest batch has data: nothing to say
    with pytest.raises(TbsError, match="layer 'conv' cannot be placed at batch 32"):
        tbs.recommend(p, "time", batch_size=32)  # asked for: placed as asked, and why it cannot be


def test_a_layer_that_does_nothing_in_the_mode_is_predicted_at_zero_and_placed_with_its_neighbours():
    """A Dropout in inference is an identity a compiled model drops (an H200 measured 0 s). Left unpredicted, it
    had to stay on the host, so a GPU placement paid two host copies around each one (EfficientNetB0's ten)."""
    from tbs.predictions.gpu_predict import IDENTITY_METHOD

    p = cpu_only()
    layers = [dict(layer, inactive=layer["name"] == "pool") for layer in p.metadata["layers"]]
    p = tbs.predict(replace(p, metadata=dict(p.metadata, layers=layers)), "t4")
    rows = p.predictions.set_index(["target", "layer", "batch_size"])
    pool = rows.loc[("layer", "pool", 32)]
    assert pool["median_s"] == pool["low_s"] == pool["high_s"] == 0.0 and pool["method"] == IDENTITY_METHOD
    assert rows.loc[("layer", "conv", 32), "median_s"] > 0  # NaN compares false: a real prediction
    rec = tbs.recommend(p, "time", batch_size=32, include_predicted=True)
    placed = dict(zip(rec.placement["layer"], rec.placement["device"]))
    assert placed["pool"] == "t4" and placed["conv"] == "t4", placed


def test_a_predicted_gpus_host_links_are_the_ones_tbs_timed_on_a_gpu_machine_and_a_tpus_stay_pcie():
    """The H200 machine's copies (profiles/h200, the median per timed size over its current profiles), not PCIe's
    25 GB/s, which read its 12 MB input batch 4.7x too fast; a predicted TPU keeps the stated PCIe assumption."""
    import glob

    import numpy as np

    from conftest import ROOT
    from tbs.place import predicted

    found = {"to": [], "from": []}
    for path in glob.glob(str(ROOT / "profiles" / "h200" / "*" / "*" / "metadata.json")):
        if "before" not in path:
            links = json.loads(Path(path).read_text())["transfers"]
            for way, key in (("to", "cpu:0->gpu:0"), ("from", "gpu:0->cpu:0")):
                if links[key].get("points"):
                    found[way].append([s for _, s in links[key]["points"]])
    assert len(found["to"]) >= 12
    for way, seconds in found.items():
        assert np.median(seconds, axis=0) == pytest.approx(predicted.GPU_LINK_SECONDS[way], rel=1e-4)
    p = tbs.predict(cpu_only(), "t4,tpu-v5e")
    with_links, note = predicted.with_predictions(p)
    links = with_links.metadata["transfers"]
    assert links["cpu:0->t4"]["points"] and 2e-3 < TransferFit.of(links["cpu:0->t4"]).seconds(12.4e6) < 3e-3
    assert links["cpu:0->tpu-v5e"] == predicted.ASSUMED_LINK and predicted.ASSUMPTION in note
    assert predicted.GPU_ASSUMPTION in note
