"""The layer graph's endpoints are names no layer or input can take (issue 30, item 6).

The capture's source and sink were the plain strings "input:<name>" and "output", compared with
layer names: a layer named ``output`` was taken for the model's output (its RNN input then lost
its activation in training, and placement sent that layer's input to the host), and the split
runners' ("input", i) met a layer named ``input``. Each stage is tried here on models whose
layers are named ``input``, ``input_1``, ``output_proj`` and ``output``, beside an input named
``image``; and an older profile's graph is read in the new names.
"""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

import tbs
from tbs.place.graph import graph_tensors
from tbs.place.result import _copies_in
from tbs.place.solvers import Problem, Tensor, brute_force, is_chain, solve, solve_two_devices
from tbs.endpoints import GRAPH_OUTPUT, input_endpoint
from tbs.schema import FORMAT_VERSION, LOSS_LAYER
from tbs.testing import FakeClock, FakeDevice, FakeLayer, FakeModel, fake_profile

NAMES = ("input", "input_1", "output_proj", "output")
SECONDS = {"cpu": {"input": 4e-4, "input_1": 3e-4, "output_proj": 2e-4, "output": 1e-4},
           "gpu": {"input": 1e-5, "input_1": 1e-5, "output_proj": 1e-5, "output": 1e-5}}


def _named_model():
    """A Functional model whose input is ``image`` and whose layers take the endpoints' old names."""
    from keras_models import named_model

    return named_model()


def _fake_named(directory, batch_sizes=(8,)):
    clock = FakeClock()
    devices = [FakeDevice(kind, 0, clock, SECONDS[kind], copy_seconds=1e-3) for kind in ("cpu", "gpu")]
    model = FakeModel([FakeLayer(name) for name in NAMES], input_name="image", name="named")
    return fake_profile(directory, model, devices, batch_sizes=batch_sizes)


def test_the_capture_names_the_inputs_and_outputs_apart_from_every_layer():
    from tbs.capture.recorder import capture

    cap = capture(_named_model(), np.ones((4, 6), "float32"), False)
    edges = [(e.src, e.dst) for e in cap.edges]
    assert edges == [("/input/image", "input"), ("input", "input_1"), ("input_1", "output_proj"),
                     ("output_proj", "output"), ("output", "/output")]
    assert [c.sources for c in cap.calls][0] == ["/input/image"]
    tensors = graph_tensors([vars(e) for e in cap.edges], [c.name for c in cap.calls])
    assert [(t.src, t.consumers) for t in tensors] == [(a, (b,)) for a, b in edges]  # nothing dropped


def test_training_skips_the_softmax_of_the_layer_named_output_not_the_rnn_before_it():
    """rnn_mnist with its last layer named ``output``: the RNN was taken for the output's producer, its
    activation swapped out ("property 'activation' of 'SimpleRNN' object has no setter"), its row an error."""
    from keras_models import keras, layers

    digits = keras.Input((5, 4), name="digits")
    x = layers.SimpleRNN(8, dropout=0.2, name="rnn")(digits)
    model = keras.Model(digits, layers.Dense(3, activation="softmax", name="output")(x))
    p = tbs.profile(model, [8], training=True, timing=tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05,
                    min_block_seconds=0.001, min_span_seconds=0.0), progress=None, report=False,
                    measure=tbs.MeasureConfig(analysis=False))  # the analysis has tests of its own
    rows = p.summary.set_index("layer")
    assert rows.loc["rnn", "status"] in ("ok", "noisy"), rows.loc["rnn", "reason"]
    assert rows.loc["rnn", "in_step"] is True and rows.loc["output (softmax)", "in_step"] is False
    graph = p.metadata["graph"]["8"]
    assert {(e["src"], e["dst"]) for e in graph} == {("/input/digits", "rnn"), ("rnn", "output"),
                                                     ("output", GRAPH_OUTPUT), ("output", LOSS_LAYER)}


def test_placement_prices_the_input_copy_and_the_layer_named_output_as_layers(tmp_path):
    p = _fake_named(tmp_path / "p")
    rec = tbs.recommend(p, "time")
    assert [(t.src, t.consumers) for t in rec.inputs.tensors] == [
        ("/input/image", ("input",)), ("input", ("input_1",)), ("input_1", ("output_proj",)),
        ("output_proj", ("output",)), ("output", (GRAPH_OUTPUT,))]
    on_gpu = {layer: "gpu:0" for layer in NAMES}
    forward, _ = _copies_in(rec.inputs, on_gpu)
    copy = rec.inputs.transfer_seconds("cpu:0", "gpu:0", rec.inputs.tensors[0].bytes)
    assert forward == {"input": pytest.approx(copy), "input_1": 0.0, "output_proj": 0.0, "output": 0.0}
    problem = Problem(rec.inputs.layers, rec.inputs.devices, rec.inputs.host,
                      {k: v for k, v in rec.inputs.seconds.items()}, rec.inputs.tensors, rec.inputs.transfer_seconds)
    assert is_chain(problem)
    layers_s = sum(rec.inputs.seconds[(layer, "gpu:0")] for layer in NAMES)
    back = rec.inputs.transfer_seconds("gpu:0", "cpu:0", rec.inputs.tensors[-1].bytes)
    assert problem.cost_of(on_gpu) == pytest.approx(layers_s + copy + back)  # in from the host and back
    assert solve(problem).cost == pytest.approx(brute_force(problem).cost)


def test_the_minimum_cut_takes_layers_named_like_its_own_nodes():
    """The s-t cut named its nodes "s", "t" and "host" beside the layers: a layer so named was merged with one
    (on 36 of these 40 problems its placement cost more than the best)."""
    layers = ["s", "t", "host", "output"]
    reads = {input_endpoint("x"): ("s", "t"), "s": ("host", "output"), "t": ("output",), "host": ("output",),
             "output": (GRAPH_OUTPUT,)}
    for seed in range(40):
        rng = random.Random(seed)
        cost = {(layer, d): rng.uniform(0.1, 5) for layer in layers for d in "ab"}
        tensors = [Tensor(src, consumers, rng.randint(1, 3000)) for src, consumers in reads.items()]
        problem = Problem(layers, ["a", "b"], "a", cost, tensors, lambda s, d, n: 0.0 if s == d else 0.5 + n * 1e-3)
        assert not is_chain(problem)
        assert solve_two_devices(problem).cost == pytest.approx(brute_force(problem).cost), seed


def _as_version_5(directory):
    """Rewrite a profile's metadata as tbs 0.5 wrote it: format 5, endpoints "input:<name>" and "output"."""
    path = directory / "metadata.json"
    meta = json.loads(path.read_text())
    old = {"/input/image": "input:image", GRAPH_OUTPUT: "output"}
    meta["graph"] = {b: [dict(e, src=old.get(e["src"], e["src"]), dst=old.get(e["dst"], e["dst"])) for e in edges]
                     for b, edges in meta["graph"].items()}
    meta["tbs_profile_version"] = 5
    path.write_text(json.dumps(meta))
    assert ("output_proj", "output") in {(e["src"], e["dst"]) for e in meta["graph"]["8"]}
    return meta


def test_a_profile_written_before_the_new_endpoints_loads_recommends_and_resumes_in_them(tmp_path):
    fresh = _fake_named(tmp_path / "fresh")
    old_dir = tmp_path / "old"
    shutil.copytree(fresh.directory, old_dir)
    _as_version_5(old_dir)
    old = tbs.load(old_dir)
    assert old.metadata["graph"] == fresh.metadata["graph"]
    assert tbs.recommend(old, "time").chosen == tbs.recommend(fresh, "time").chosen
    assert "Recommended placement" in tbs.render(old, "html")
    # An interrupted version-5 profile resumed by this tbs goes on in the new names, all of it.
    meta = json.loads((old_dir / "metadata.json").read_text())
    meta["status"] = "interrupted"
    (old_dir / "metadata.json").write_text(json.dumps(meta))
    resumed = _resume_named(old_dir)
    written = json.loads((old_dir / "metadata.json").read_text())
    assert written["tbs_profile_version"] == FORMAT_VERSION and set(written["graph"]) == {"8", "64"}
    assert written["graph"]["8"] == fresh.metadata["graph"]["8"]
    ends = {e["src"] for edges in written["graph"].values() for e in edges} | {
        e["dst"] for edges in written["graph"].values() for e in edges}
    assert ends == {"/input/image", *NAMES, GRAPH_OUTPUT}
    assert sorted(resumed.summary["batch_size"].unique()) == [8, 64]


def _resume_named(directory):
    clock = FakeClock()
    devices = [FakeDevice(kind, 0, clock, SECONDS[kind], copy_seconds=1e-3) for kind in ("cpu", "gpu")]
    model = FakeModel([FakeLayer(name) for name in NAMES], input_name="image", name="named")
    return fake_profile(directory, model, devices, batch_sizes=(8, 64), resume=True)


@pytest.fixture(scope="module")
def named_on_two_cpus(two_cpus_run):
    """The named model profiled for inference and for training on two logical CPUs, each recommended and
    verified, in the tests' two-CPU process (conftest.two_cpus_run: logical devices are made at TensorFlow's
    start): both profiles, and the five commands' stdout."""
    paths = two_cpus_run["paths"]
    return paths["named"], paths["named_training"], [run["stdout"] for run in two_cpus_run["runs"][2:7]]


def test_the_named_model_is_placed_with_its_input_copy_and_verified(named_on_two_cpus):
    _, _, stdout = named_on_two_cpus
    tensors = json.loads(stdout[1])["inputs"]["tensors"]
    assert tensors[0]["src"] == "/input/image" and tensors[0]["consumers"] == ["input"]
    assert tensors[-1] == {"src": "output", "consumers": [GRAPH_OUTPUT], "bytes": 8 * 3 * 4}
    assert "Verdict:" in stdout[2] and "4 of 4 layers ran their ops on the device they were placed on" in stdout[2]


def test_the_named_model_trains_layer_by_layer_and_as_a_split_step(named_on_two_cpus):
    _, train, stdout = named_on_two_cpus
    p = tbs.load(train)
    rows = p.summary[p.summary["device"] == "cpu:0"].set_index("layer")
    assert set(rows["status"]) <= {"ok", "noisy"}, rows["reason"].to_dict()
    assert rows.loc["output (softmax)", "in_step"] is False and rows.loc["output_proj", "in_step"] is True
    assert rows.loc["input", "phases"] == "forward+backward+update"
    assert "Verdict:" in stdout[4] and "4 of 4 layers ran their ops" in stdout[4]
