"""tbs recommend on a profile with scripted timings (a fake second device)."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from tbs.cli import cli
from tbs.profiles.profile import Profile
from tbs.place.recommend import recommend

LAYERS = ["pre", "conv", "pool", "dense"]
# seconds per batch of 8: the gpu wins conv and dense, the cpu wins pre and pool (ping-pong bait)
SECONDS = {("pre", "cpu:0"): 1.0, ("pre", "gpu:0"): 1.2, ("conv", "cpu:0"): 10.0, ("conv", "gpu:0"): 1.0,
           ("pool", "cpu:0"): 0.5, ("pool", "gpu:0"): 0.6, ("dense", "cpu:0"): 4.0, ("dense", "gpu:0"): 0.5}


def fake_profile(tmp_path, transfer_alpha=0.3, prices=None, backend=None, dispatch_s=None, ci=0.0):
    rows = []
    for (layer, device), seconds in SECONDS.items():
        rows.append({"layer": layer, "layer_type": "X", "category": "other", "device": device,
                     "device_kind": device.split(":")[0], "batch_size": 8, "mode": "inference", "status": "ok",
                     "n": 10, "median_s": seconds, "p25_s": seconds, "p75_s": seconds, "ci_low_s": seconds * (1 - ci),
                     "ci_high_s": seconds * (1 + ci), "per_sample_s": seconds / 8, "usd_per_hour": None,
                     "cost_per_sample_usd": None})
    edges = [{"src": "/input/x", "dst": "pre", "bytes": 1000, "shape": [8, 10], "dtype": "float32"}]
    edges += [{"src": a, "dst": b, "bytes": 1000, "shape": [8, 10], "dtype": "float32"} for a, b in zip(LAYERS, LAYERS[1:])]
    edges += [{"src": "dense", "dst": "/output", "bytes": 40, "shape": [8, 1], "dtype": "float32"}]
    fit = {"alpha_s": transfer_alpha, "beta_s_per_byte": 0.0}
    meta = {"layers": [{"name": l, "type": "X", "category": "other"} for l in LAYERS], "graph": {"8": edges},
            "transfers": {"cpu:0->gpu:0": fit, "gpu:0->cpu:0": fit}, "host_device": "cpu:0",
            "prices_usd_per_hour": prices or {}, "model": {"name": "fake", "sha256": "x"}, "status": "complete",
            "host": {"hostname": "h"}}
    directory = tmp_path / "fake"
    directory.mkdir(parents=True)
    (directory / "metadata.json").write_text(json.dumps(meta))
    if backend:
        meta["backend"] = backend
    summary = pd.DataFrame(rows)
    summary.to_csv(directory / "summary.csv", index=False)
    model = pd.DataFrame([{"device": d, "batch_size": 8, "mode": "inference", "status": "ok",
                           "dispatch_overhead_s": s}
                          for d, s in (dispatch_s or {}).items()])
    if len(model):
        model.to_csv(directory / "model.csv", index=False)
    return Profile(directory, meta, summary, model, pd.DataFrame())


def test_time_placement_avoids_transfers_that_do_not_pay(tmp_path):
    rec = recommend(fake_profile(tmp_path), objective="time")
    # argmin ping-pongs cpu,gpu,cpu,gpu (3 copies + output back = 4 x 0.3 s); the optimum moves once each way
    assert rec.argmin.placement == {"pre": "cpu:0", "conv": "gpu:0", "pool": "cpu:0", "dense": "gpu:0"}
    assert rec.chosen.placement == {"pre": "cpu:0", "conv": "gpu:0", "pool": "gpu:0", "dense": "gpu:0"}
    assert rec.chosen.seconds_per_batch == pytest.approx(1.0 + 1.0 + 0.6 + 0.5 + 2 * 0.3)
    assert rec.chosen.seconds_per_batch < rec.argmin.seconds_per_batch
    best_single = min(e.seconds_per_batch for e in rec.single_devices)
    assert rec.chosen.seconds_per_batch < best_single


def test_each_program_call_pays_its_devices_dispatch_where_a_split_runs_a_call_per_segment(tmp_path):
    """Free copies: ping-pong (cpu, gpu, cpu, gpu) is fastest by layer times alone (3.0 s). On JAX each run of
    layers on one device is its own program call, so ping-pong pays four dispatches (4.0 s) and all on the GPU
    (3.3 s + one) wins; on TensorFlow a split is one graph, one dispatch, and ping-pong stays the answer."""
    ping_pong = {"pre": "cpu:0", "conv": "gpu:0", "pool": "cpu:0", "dense": "gpu:0"}
    dispatch = {"cpu:0": 0.25, "gpu:0": 0.25}
    jax = recommend(fake_profile(tmp_path / "jax", transfer_alpha=0.0, backend="jax", dispatch_s=dispatch), "time")
    assert set(jax.chosen.placement.values()) == {"gpu:0"}
    assert jax.chosen.seconds_per_batch == pytest.approx(3.3 + 0.25)
    assert jax.argmin.seconds_per_batch == pytest.approx(3.0 + 4 * 0.25)  # each device change starts a program
    rows = jax.placement
    assert rows["dispatch_seconds_per_sample"].tolist() == pytest.approx([0.25 / 8, 0, 0, 0])
    total = rows[["seconds_per_sample", "transfer_in_seconds_per_sample", "dispatch_seconds_per_sample"]].sum().sum()
    assert total * 8 == pytest.approx(jax.chosen.seconds_per_batch)
    assert "one program call per run of consecutive layers on one device" in jax.data.dispatch_note
    tf = recommend(fake_profile(tmp_path / "tf", transfer_alpha=0.0, backend="tensorflow", dispatch_s=dispatch),
                   "time")
    assert tf.chosen.placement == ping_pong
    assert tf.chosen.seconds_per_batch == pytest.approx(3.0 + 0.25)
    assert "one program call for the whole placement" in tf.data.dispatch_note


def test_a_device_whose_dispatch_was_never_timed_is_named_not_priced_at_zero_silently(tmp_path):
    rec = recommend(fake_profile(tmp_path, transfer_alpha=0.0, backend="jax", dispatch_s={"cpu:0": 0.25}), "time")
    assert rec.data.dispatch_seconds == {"cpu:0": 0.25}
    assert "not priced on gpu:0 (no whole-model call timed there)" in rec.data.dispatch_note
    text = CliRunner().invoke(cli, ["recommend", str(tmp_path / "fake"), "--objective", "time"]).output
    assert "not priced on gpu:0" in text
    # a predicted device is never cheaper to call than the host that calls it: the host's dispatch, said so
    predicted = fake_profile(tmp_path / "predicted", transfer_alpha=0.0, backend="jax", dispatch_s={"cpu:0": 0.25})
    predicted.metadata["predicted_devices"] = ["gpu:0"]
    rec = recommend(predicted, "time")
    assert rec.data.dispatch_seconds == {"cpu:0": 0.25, "gpu:0": 0.25}
    assert "assumed on gpu:0 (predicted): the host cpu:0's, a floor" in rec.data.dispatch_note
    assert "not priced" not in rec.data.dispatch_note


def test_a_profile_without_per_size_copy_times_is_priced_through_its_raw_copies(tmp_path):
    """Profiles written before the timed sizes were kept beside the line: their raw copies are read again."""
    profile = fake_profile(tmp_path)  # the line: 0.3 s a copy
    sizes = [1000] * 3 + [10_000_000] * 3
    profile.transfers = pd.DataFrame([{"src": s, "dst": d, "bytes": b, "sample": i % 3, "seconds": 0.05 if b == 1000
                                       else 0.5} for s, d in (("cpu:0", "gpu:0"), ("gpu:0", "cpu:0"))
                                      for i, b in enumerate(sizes)])
    rec = recommend(profile, objective="time")
    assert rec.data.fits["cpu:0->gpu:0"].points == ((1000.0, 0.05), (10_000_000.0, 0.5))
    assert rec.data.transfer_seconds("cpu:0", "gpu:0", 1000) == pytest.approx(0.0)  # the 1 KB activations
    assert rec.data.transfer_seconds("cpu:0", "gpu:0", 10_000_000) == pytest.approx(0.45)
    # the line's 0.3 s a copy moved the layers once each way; copies of 1 KB that add nothing to the smallest
    # timed one let each layer go where it runs fastest
    assert rec.chosen.placement == {"pre": "cpu:0", "conv": "gpu:0", "pool": "cpu:0", "dense": "gpu:0"}


def test_expensive_copies_keep_everything_on_one_device(tmp_path):
    rec = recommend(fake_profile(tmp_path, transfer_alpha=100.0), objective="time")
    assert set(rec.chosen.placement.values()) == {"cpu:0"}


def test_cost_objective_metered_and_dedicated(tmp_path):
    profile = fake_profile(tmp_path, prices={"cpu": 1.0, "gpu": 10.0})
    metered = recommend(profile, objective="cost", billing="metered")
    dedicated = recommend(profile, objective="cost", billing="dedicated")
    # dedicated: every used device bills for the whole latency
    used = set(dedicated.chosen.placement.values())
    price = sum({"cpu:0": 1.0, "gpu:0": 10.0}[d] for d in used)
    assert dedicated.chosen.usd_per_batch == pytest.approx(price * dedicated.chosen.seconds_per_batch / 3600)
    assert metered.chosen.usd_per_batch <= min(e.usd_per_batch for e in metered.single_devices) + 1e-12


def test_latency_cap_and_frontier(tmp_path):
    profile = fake_profile(tmp_path, prices={"cpu": 1.0, "gpu": 10.0})
    cheapest = recommend(profile, objective="cost")
    capped = recommend(profile, objective="cost", max_latency_ms=4000)
    assert capped.chosen.seconds_per_batch <= 4.0 + 1e-9
    assert capped.chosen.usd_per_batch >= cheapest.chosen.usd_per_batch - 1e-15
    times = [e.seconds_per_batch for e in cheapest.frontier]
    costs = [e.usd_per_batch for e in cheapest.frontier]
    assert times == sorted(times) and costs == sorted(costs, reverse=True) and len(times) >= 2


def test_cli_json_carries_the_inputs(tmp_path):
    fake_profile(tmp_path, prices={"cpu": 1.0, "gpu": 10.0})
    result = CliRunner().invoke(cli, ["recommend", str(tmp_path / "fake"), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.output)
    assert out["inputs"]["transfer_fits"]["cpu:0->gpu:0"]["alpha_s"] == 0.3
    assert out["inputs"]["layer_seconds"]["conv"]["gpu:0"] == 10.0 or out["inputs"]["layer_seconds"]["conv"]["gpu:0"] == 1.0
    assert {"recommended", "single_devices", "per_layer_argmin", "saving", "frontier"} <= set(out)
    text = CliRunner().invoke(cli, ["recommend", str(tmp_path / "fake"), "--objective", "time"])
    assert "Saving against the best single device" in text.output
    bad = CliRunner().invoke(cli, ["recommend", str(tmp_path / "fake"), "--batch", "3"])
    assert bad.exit_code == 2 and "is not in this profile: it has 8" in bad.stderr


def test_replay_of_the_recorded_pass_computes_the_model():
    """The split-model runner replays every call with its real dataflow: same outputs as the model."""
    import numpy as np

    from keras_models import branchy_model
    from tbs.backends.tensors import iter_tensors
    from tbs.capture.recorder import capture
    from tbs.load.inputs import input_specs, structure_inputs, synthetic_batch
    from tbs.backends.tensorflow.discovery import discover
    from tbs.place.verify import dataflow, replay_fn

    device = discover(tpu_timeout_s=0.1).devices[0]
    model = branchy_model()
    inputs = device.place(structure_inputs(model, synthetic_batch(input_specs(model), 3)))
    cap = capture(model, inputs, training=False)
    plan, outputs = dataflow(cap, inputs)
    placement = {c.name: device.name for c in cap.calls}
    replay = replay_fn(placement, {device.name: {c.name: c for c in cap.calls}}, {device.name: device}, plan,
                       outputs, [c.name for c in cap.calls])
    got = replay(*iter_tensors(inputs))
    want = list(iter_tensors(model(inputs, training=False)))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)


def test_a_replayed_split_runs_each_run_of_one_devices_calls_as_one_segment():
    """A split is deployed as one program per run of layers on a device, not one per layer: on JAX each program
    pays a dispatch (~0.4 ms on an H200, where cnn_flowers' layer-by-layer replay measured 2.3x its prediction)."""
    from tbs.endpoints import GRAPH_INPUT
    from tbs.place.verify import segments

    order = ["a", "b", "c", "d"]
    plan = [[(GRAPH_INPUT, 0)], [("a", 0)], [("b", 0), None], [("c", 0), ("a", 0)]]
    placement = {"a": "cpu:0", "b": "cpu:0", "c": "gpu:0", "d": "cpu:0"}
    found = segments(placement, plan, [("d", 0), ("b", 0)], order)
    assert [(s.device, s.names) for s in found] == [("cpu:0", ("a", "b")), ("gpu:0", ("c",)), ("cpu:0", ("d",))]
    assert found[0].inputs == ((GRAPH_INPUT, 0),) and found[0].outputs == (("b", 0), ("a", 0))  # what later runs read
    assert (found[1].inputs, found[1].outputs) == ((("b", 0),), (("c", 0),))
    assert found[2].inputs == (("c", 0), ("a", 0)) and found[2].outputs == (("d", 0),)
    assert len(segments({n: "cpu:0" for n in order}, plan, [("d", 0)], order)) == 1  # one device: one program


def test_a_split_is_a_win_only_when_it_measures_better():
    from tbs.measure.stats import Summary
    from tbs.place.verify import Verified, verdict

    def v(placement, median, half):
        return Verified("x", placement, 1.0, Summary(10, median, median, median, median - half, median + half), "ok")

    split, single = {"a": "cpu:0", "b": "gpu:0"}, {"a": "gpu:0", "b": "gpu:0"}
    assert verdict(v(split, 1.0, 0.05), v(single, 1.5, 0.05)).startswith("measured win")
    assert verdict(v(split, 1.0, 0.3), v(single, 1.2, 0.3)).startswith("no measured win: the split and")
    assert verdict(v(split, 2.0, 0.1), v(single, 1.0, 0.1)).startswith("no measured win: the best single")


def _fail(directory, layer, device, status="error", median=None):
    summary = pd.read_csv(directory / "summary.csv")
    where = (summary["layer"] == layer) & (summary["device"] == device)
    summary.loc[where, ["status", "reason", "median_s"]] = [status, "ValueError: no kernel", median]
    summary.to_csv(directory / "summary.csv", index=False)


def test_a_layer_that_ran_nowhere_is_one_line_naming_it_not_an_infinite_placement(tmp_path):
    profile = fake_profile(tmp_path, prices={"cpu": 1.0, "gpu": 3.0})
    for device in ("cpu:0", "gpu:0"):
        _fail(profile.directory, "conv", device)
    for objective in ("time", "cost"):
        done = CliRunner().invoke(cli, ["recommend", str(profile.directory), "--objective", objective])
        assert done.exit_code == 2 and done.stdout == "" and "inf" not in done.stderr
        assert done.stderr.count("\n") == 1
        assert "layer 'conv' cannot be placed at batch 8: no profiled device ran it (cpu:0: error: ValueError: " \
               "no kernel; gpu:0: error: ValueError: no kernel)" in done.stderr


def test_a_layer_that_runs_only_on_an_unpriced_device_says_so_not_relax_a_cap(tmp_path):
    profile = fake_profile(tmp_path, prices={"cpu": 1.0})
    _fail(profile.directory, "conv", "cpu:0", status="oom")
    done = CliRunner().invoke(cli, ["recommend", str(profile.directory)])
    assert done.exit_code == 2 and "relax" not in done.stderr
    assert "layer 'conv' runs only on gpu:0, which has no price: give one with --cost" in done.stderr
    timed = CliRunner().invoke(cli, ["recommend", str(profile.directory), "--objective", "time"])
    assert timed.exit_code == 0 and "conv  gpu:0" in timed.stdout


def test_relax_the_cap_is_said_only_when_a_cap_was_given(tmp_path):
    profile = fake_profile(tmp_path, prices={"cpu": 1.0, "gpu": 3.0})
    capped = CliRunner().invoke(cli, ["recommend", str(profile.directory), "--max-latency", "0.001"])
    assert capped.exit_code == 2 and "relax --max-latency or --budget" in capped.stderr


@pytest.mark.parametrize("ci, beyond", [(0.05, True), (0.2, False)])
def test_a_saving_is_said_to_be_noise_when_the_moved_layers_intervals_cover_it(tmp_path, ci, beyond):
    """All on gpu:0 is 3.9 s, the placement (pre on cpu:0) 3.7 s: 5.1%. pre's 95% intervals at their far ends
    (1.0 s up, 1.2 s down by ci each) leave (0.2 - 2.2 ci) / 3.9: 2.3% at ci 5%, -6.2% at 20%: noise."""
    from tbs.place.result import saving
    from tbs.report import console
    from tbs.report.html import section_placement
    from tbs.report.page import ReportData, esc
    from tbs.report.vocabulary import saving_line

    profile = fake_profile(tmp_path, ci=ci)
    rec = recommend(profile, objective="time")
    gain = saving(rec)
    assert gain["best_single_device"] == "all on gpu:0" and gain["saving_fraction"] == pytest.approx(0.2 / 3.9)
    assert gain["saving_fraction_at_far_ends"] == pytest.approx((0.2 - 2.2 * ci) / 3.9)
    line = saving_line(rec)
    assert ("within the measurements' noise" in line) is not beyond and ("at least 2.3%" in line) is beyond
    assert line in console.recommendation_text(rec)
    assert esc(line) in section_placement(ReportData(profile, None, rec, None))
