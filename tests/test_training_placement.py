"""Placement of a training step: the loss is placed, gradients cross devices back, and the solvers stay exact."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import replace

import pytest

from test_placement import random_problem
from tbs.place.data import gather
from tbs.place.recommend import evaluate, recommend
from tbs.place.result import TRAINING_NOTE
from tbs.place.solvers import Problem, Tensor, brute_force, is_chain, solve_chain, solve_milp, solve_two_devices
from tbs.report.base import render
from tbs.schema import LOSS_LAYER
from tbs.testing.training import fake_training_profile

ALPHA = 1e-3  # seconds per copy, either way, whatever its size
# Every layer is cheaper on the CPU but dense, which saves 3 ms on the GPU: a split costs two
# activation copies (2 ms, worth it) forward-only, but four copies (4 ms, not worth it) once its
# two gradients come back.
SPLIT_BAIT = {
    "cpu:0": {"vectorize": (1e-3, 0.0, 0.0), "embedding": (1e-3, 1e-3, 1e-3), "pool": (1e-3, 1e-3, 0.0),
              "dense": (3e-3, 5e-3, 2e-3), "head": (1e-3, 1e-3, 1e-3), LOSS_LAYER: (1e-3, 1e-3, 0.0)},
    "gpu:0": {"vectorize": (2e-3, 0.0, 0.0), "embedding": (2e-3, 2e-3, 2e-3), "pool": (2e-3, 2e-3, 0.0),
              "dense": (2e-3, 3e-3, 2e-3), "head": (2e-3, 2e-3, 2e-3), LOSS_LAYER: (2e-3, 2e-3, 0.0)},
}


@pytest.fixture(scope="module")
def bait(tmp_path_factory):
    return fake_training_profile(tmp_path_factory.mktemp("train") / "bait", seconds=SPLIT_BAIT, batch_sizes=(8,),
                                 transfer_fit=(ALPHA, 0.0))


def _forward_only(profile):
    """The same profile with no gradient along any edge: what placement would do if it ignored the backward."""
    metadata = copy.deepcopy(dict(profile.metadata))
    for edges in metadata["graph"].values():
        for edge in edges:
            edge["grad"] = False
    return replace(profile, metadata=metadata)


def test_gradients_sent_back_change_the_placement(bait):
    forward_only = recommend(_forward_only(bait), "time")
    assert forward_only.chosen.placement["dense"] == "gpu:0"
    assert set(forward_only.chosen.placement.values()) == {"cpu:0", "gpu:0"}
    both_ways = recommend(bait, "time")
    assert set(both_ways.chosen.placement.values()) == {"cpu:0"}
    # The split forward-only chose pays 2 activation copies and 2 gradient copies in training: 3 ms saved, 4 ms paid.
    inp = gather(bait, 8)
    split = evaluate(inp, "split", forward_only.chosen.placement, "metered")
    nodes = sum(inp.seconds[(layer, device)] for layer, device in forward_only.chosen.placement.items())
    assert split.seconds_per_batch == pytest.approx(nodes + 4 * ALPHA)
    assert split.seconds_per_batch > both_ways.chosen.seconds_per_batch


def test_the_loss_is_a_placed_node_fed_by_the_output_and_nothing_returns_to_the_host(bait):
    inp = gather(bait, 8)
    assert inp.layers[-1] == LOSS_LAYER and inp.mode == "training"
    fed = [t for t in inp.tensors if LOSS_LAYER in t.consumers]
    assert [(t.src, t.grad) for t in fed] == [("head", False), ("head", True)]
    assert not any("/output" in t.consumers for t in inp.tensors)  # the outputs go to the loss in training
    gradients = {t.src for t in inp.tensors if t.grad}
    assert gradients == {"embedding", "pool", "dense", "head"}  # nothing before the embedding needs one
    assert inp.as_dict()["mode"] == "training"
    assert {"src": "head", "consumers": [LOSS_LAYER], "bytes": 128, "grad": True} in inp.as_dict()["tensors"]


def test_rows_say_which_copies_each_layer_waits_for(bait):
    rec = recommend(_forward_only(bait), "time")
    rec.inputs = gather(bait, 8)  # the same split, priced with its gradients
    rows = rec.placement.set_index("layer")
    assert rows.loc["dense", "transfer_in_seconds_per_sample"] == pytest.approx(ALPHA / 8)  # pool's activation
    assert rows.loc["pool", "gradient_in_seconds_per_sample"] == pytest.approx(ALPHA / 8)  # dense's gradient back
    assert rows.loc["dense", "gradient_in_seconds_per_sample"] == pytest.approx(ALPHA / 8)  # head's gradient back
    assert rows.loc["vectorize", "gradient_in_seconds_per_sample"] == 0.0
    assert rec.mode_note == TRAINING_NOTE


def test_text_and_json_say_the_mode(bait):
    rec = recommend(bait, "time")
    assert TRAINING_NOTE in render(None, "text", rec) and "gradient in" in render(None, "text", rec)
    assert f'"mode_note": "{TRAINING_NOTE}"' in render(None, "json", rec)
    assert "mode_note" not in render(None, "json", recommend(fake_training_profile(
        bait.directory.parent / "inference", seconds=SPLIT_BAIT, batch_sizes=(8,), training=False), "time"))


def test_an_inference_profile_of_the_same_model_has_no_loss_and_no_gradient(tmp_path):
    profile = fake_training_profile(tmp_path / "inf", seconds=SPLIT_BAIT, batch_sizes=(8,), training=False)
    inp = gather(profile, 8)
    assert LOSS_LAYER not in inp.layers and not any(t.grad for t in inp.tensors)
    assert ("head", ("/output",)) in [(t.src, t.consumers) for t in inp.tensors]
    assert "gradient_in_seconds_per_sample" not in recommend(profile, "time").placement


def _with_gradients(problem: Problem, seed: int) -> Problem:
    """The problem with a gradient (same bytes, back) along a random part of its layer-to-layer tensors."""
    rng = random.Random(seed)
    back = [Tensor(t.src, tuple(c for c in t.consumers if c != "/output"), t.bytes, grad=True)
            for t in problem.tensors if not t.src.startswith("/input/") and rng.random() < 0.7]
    return replace(problem, tensors=problem.tensors + [t for t in back if t.consumers])


def _asymmetric(problem: Problem) -> Problem:
    """Copies cost 10x more one way than the other, so a gradient paid in the wrong direction would show."""
    return replace(problem, transfer_cost=lambda s, d, n: 0.0 if s == d else (0.5 if s < d else 0.05) * (1 + n / 100))


@pytest.mark.parametrize("seed", range(10))
def test_solvers_with_gradients_match_brute_force(seed):
    chain = _asymmetric(_with_gradients(random_problem(seed, 6, ["cpu", "gpu", "tpu"], chain=True), seed))
    assert is_chain(chain)
    assert solve_chain(chain).cost == pytest.approx(brute_force(chain).cost)
    dag = _asymmetric(_with_gradients(random_problem(seed, 7, ["cpu", "gpu"]), seed))
    got = solve_two_devices(dag)
    assert got.cost == pytest.approx(brute_force(dag).cost, rel=1e-6)
    three = _asymmetric(_with_gradients(random_problem(seed, 6, ["cpu", "gpu", "tpu"]), seed))
    assert solve_milp(three).cost == pytest.approx(brute_force(three).cost, rel=1e-7)


def test_a_gradient_is_paid_from_each_reader_device_to_the_producer_once():
    node = {(l, d): 1.0 for l in "abc" for d in ("cpu", "gpu")}
    cost = {("cpu", "gpu"): 10.0, ("gpu", "cpu"): 1.0}
    tensors = [Tensor("a", ("b", "c"), 4), Tensor("a", ("b", "c"), 4, grad=True)]
    problem = Problem(list("abc"), ["cpu", "gpu"], "cpu", node, tensors,
                      lambda s, d, n: 0.0 if s == d else cost[(s, d)])
    # a on cpu, b and c on gpu: the activation goes cpu->gpu once (10), the summed gradient gpu->cpu once (1)
    assert problem.cost_of({"a": "cpu", "b": "gpu", "c": "gpu"}) == pytest.approx(3.0 + 10.0 + 1.0)
    assert problem.cost_of({"a": "gpu", "b": "cpu", "c": "gpu"}) == pytest.approx(3.0 + 1.0 + 10.0)
    assert math.isclose(solve_two_devices(problem).cost, 3.0)
