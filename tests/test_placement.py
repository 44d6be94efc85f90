"""Placement solvers are exact: they match brute force on small random graphs."""

import math
import random

import pytest

from tbs.place.solvers import (INFEASIBLE, Problem, Tensor, brute_force, is_chain, solve, solve_chain, solve_milp,
                           solve_two_devices)


def _transfer(alpha, beta):
    def cost(a, b, nbytes):
        return 0.0 if a == b else alpha[(a, b)] + beta[(a, b)] * nbytes
    return cost


def random_problem(seed, n_layers, devices, chain=False, infeasible=0.1):
    rng = random.Random(seed)
    layers = [f"l{i}" for i in range(n_layers)]
    node_cost = {}
    for layer in layers:
        for d in devices:
            node_cost[(layer, d)] = INFEASIBLE if (d != devices[0] and rng.random() < infeasible) else rng.uniform(0.1, 5)
    tensors = []
    if chain:
        tensors.append(Tensor("/input/x", (layers[0],), rng.randint(1, 100)))
        for a, b in zip(layers, layers[1:]):
            tensors.append(Tensor(a, (b,), rng.randint(1, 100)))
        tensors.append(Tensor(layers[-1], ("/output",), rng.randint(1, 100)))
    else:
        consumed = set()
        tensors.append(Tensor("/input/x", tuple(sorted({layers[0], *rng.sample(layers, k=min(2, n_layers))})),
                              rng.randint(1, 100)))
        consumed.update(tensors[-1].consumers)
        for i, layer in enumerate(layers):
            later = layers[i + 1:]
            if not later:
                tensors.append(Tensor(layer, ("/output",), rng.randint(1, 100)))
                continue
            k = rng.randint(1, min(3, len(later)))
            consumers = tuple(sorted(set(rng.sample(later, k)) | ({"/output"} if rng.random() < 0.2 else set())))
            tensors.append(Tensor(layer, consumers, rng.randint(1, 100)))
    alpha = {(a, b): rng.uniform(0.0, 2.0) for a in devices for b in devices if a != b}
    beta = {(a, b): rng.uniform(0.0, 0.05) for a in devices for b in devices if a != b}
    return Problem(layers, list(devices), devices[0], node_cost, tensors, _transfer(alpha, beta))


@pytest.mark.parametrize("seed", range(12))
def test_chain_dp_is_optimal(seed):
    problem = random_problem(seed, 6, ["cpu", "gpu", "tpu"], chain=True)
    assert is_chain(problem)
    assert solve_chain(problem).cost == pytest.approx(brute_force(problem).cost)


@pytest.mark.parametrize("seed", range(15))
def test_two_device_min_cut_is_optimal_on_dags(seed):
    problem = random_problem(seed, 7, ["cpu", "gpu"])
    got, best = solve_two_devices(problem), brute_force(problem)
    assert got.cost == pytest.approx(best.cost, rel=1e-6)
    assert problem.cost_of(got.placement) == pytest.approx(got.cost)


@pytest.mark.parametrize("seed", range(10))
def test_milp_is_optimal_for_three_devices(seed):
    problem = random_problem(seed, 6, ["cpu", "gpu", "tpu"])
    assert solve_milp(problem).cost == pytest.approx(brute_force(problem).cost, rel=1e-7)


@pytest.mark.parametrize("seed", range(6))
def test_milp_is_optimal_at_the_scale_of_usd_per_batch(seed):
    """Costs of 1e-10 to 1e-8 (USD a batch; seconds are not much larger): under HiGHS's 1e-7 tolerances every
    copy looked free and EfficientNetB0's cost placement came out at twice the cost of all on one GPU."""
    problem = random_problem(seed, 6, ["cpu", "gpu", "tpu"])
    tiny = Problem(problem.layers, problem.devices, problem.host, {k: v * 1e-9 for k, v in problem.node_cost.items()},
                   problem.tensors, lambda s, d, n: problem.transfer_cost(s, d, n) * 1e-9)
    assert solve_milp(tiny).cost == pytest.approx(brute_force(tiny).cost, rel=1e-7)


@pytest.mark.parametrize("seed", range(6))
def test_every_solver_stays_exact_when_each_device_change_in_call_order_pays_a_dispatch(seed):
    """Order tensors (zero bytes, one per consecutive pair of layers) cost the new device's dispatch."""
    for devices, solver, chain in ((["cpu", "gpu", "tpu"], solve_chain, True),
                                   (["cpu", "gpu"], solve_two_devices, False), (["cpu", "gpu", "tpu"], solve_milp, False)):
        problem = random_problem(seed, 6, devices, chain=chain)
        problem.tensors += [Tensor(a, (b,), 0, order=True) for a, b in zip(problem.layers, problem.layers[1:])]
        problem.dispatch = {d: 0.5 + i for i, d in enumerate(devices)}
        got, best = solver(problem), brute_force(problem)
        assert got.cost == pytest.approx(best.cost, rel=1e-6)
        changes = sum(got.placement[a] != got.placement[b] for a, b in zip(problem.layers, problem.layers[1:]))
        without = Problem(problem.layers, devices, problem.host, problem.node_cost,
                          [t for t in problem.tensors if not t.order], problem.transfer_cost)
        assert problem.cost_of(got.placement) >= without.cost_of(got.placement) + 0.5 * changes - 1e-9


def test_transfers_that_cost_more_than_they_save_are_avoided():
    """Per-layer argmin would ping-pong cpu/gpu; the optimum stays put."""
    layers = ["a", "b", "c", "d"]
    node = {("a", "cpu"): 1.0, ("a", "gpu"): 0.9, ("b", "cpu"): 0.9, ("b", "gpu"): 1.0,
            ("c", "cpu"): 1.0, ("c", "gpu"): 0.9, ("d", "cpu"): 0.9, ("d", "gpu"): 1.0}
    tensors = [Tensor("/input/x", ("a",), 10), Tensor("a", ("b",), 10), Tensor("b", ("c",), 10),
               Tensor("c", ("d",), 10), Tensor("d", ("/output",), 10)]
    problem = Problem(layers, ["cpu", "gpu"], "cpu", node, tensors, lambda s, d, n: 0.0 if s == d else 0.5)
    argmin = {l: min(["cpu", "gpu"], key=lambda d: node[(l, d)]) for l in layers}
    best = solve(problem)
    assert set(best.placement.values()) == {"cpu"}
    assert best.cost < problem.cost_of(argmin)


def test_a_tensor_read_twice_on_one_device_is_moved_once():
    node = {("a", "cpu"): 9.0, ("a", "gpu"): 1.0, ("b", "cpu"): 9.0, ("b", "gpu"): 1.0}
    tensors = [Tensor("/input/x", ("a", "b"), 100), Tensor("a", ("/output",), 1), Tensor("b", ("/output",), 1)]
    problem = Problem(["a", "b"], ["cpu", "gpu"], "cpu", node, tensors, lambda s, d, n: 0.0 if s == d else 1.0 + n * 0.01)
    placement = {"a": "gpu", "b": "gpu"}
    # input to gpu once (2.0), two outputs back to the cpu (1.01 each), nodes 2.0
    assert problem.cost_of(placement) == pytest.approx(2.0 + 2.0 + 2 * 1.01)
    assert solve_two_devices(problem).placement == placement


def test_layers_a_device_cannot_run_are_never_placed_there():
    problem = random_problem(3, 6, ["cpu", "gpu", "tpu"], infeasible=0.5)
    best = solve(problem)
    assert all(math.isfinite(problem.node_cost[(l, d)]) for l, d in best.placement.items())


def test_transfer_line_fit():
    from tbs.measure.transfers import fit_line

    sizes = [1e3] * 3 + [1e6] * 3 + [1e7] * 3
    seconds = [1e-5 + 2e-10 * b for b in sizes]
    seconds[1] *= 5  # one outlier at a size does not move the median
    fit = fit_line(sizes, seconds)
    assert fit.alpha_s == pytest.approx(1e-5, rel=1e-3) and fit.beta_s_per_byte == pytest.approx(2e-10, rel=1e-3)
    assert fit.seconds(1e6) == pytest.approx(2e-4 - 2e-10 * 1e3)  # beyond the smallest timed copy


def test_a_copy_is_priced_through_its_timed_sizes_beyond_the_wait_every_timed_copy_includes():
    """An H200's copies to its host as timed: ~60 µs up to 4 MB (each waited for), 26 ms at 32 MB. Least
    squares follows the largest size and prices 4 MB at 3.4 ms; the timed sizes price it at what it adds to
    the smallest copy (whose wait a placed pass pays once, in its dispatch)."""
    from tbs.measure.transfers import TransferFit, fit_line

    timed = {4_096: 65e-6, 262_144: 50e-6, 4_194_304: 53e-6, 33_554_432: 26.1e-3}
    fit = fit_line([b for b in timed for _ in range(3)], [s for s in timed.values() for _ in range(3)])
    assert fit.alpha_s + fit.beta_s_per_byte * 4_194_304 > 3e-3  # what the line alone says
    assert fit.seconds(1_000) == 0.0 and fit.seconds(4_096) == 0.0
    assert fit.seconds(4_194_304) == pytest.approx(0.0)  # a larger copy never costs less than a smaller one
    assert fit.seconds(33_554_432) == pytest.approx(26.1e-3 - 65e-6)
    assert fit.seconds(18_874_368) == pytest.approx((26.1e-3 - 65e-6) / 2)  # halfway between the last two sizes
    slope = (26.1e-3 - 65e-6) / (33_554_432 - 4_194_304)
    assert fit.seconds(67_108_864) == pytest.approx(26.1e-3 - 65e-6 + slope * 33_554_432)
    again = TransferFit.of(fit.as_dict())  # as metadata.json keeps it
    assert again == fit and TransferFit.of({"alpha_s": 1e-5, "beta_s_per_byte": 1e-9}).seconds(1e6) == 1e-5 + 1e-3


def test_inception_sized_graph_three_devices_solves_quickly():
    """~300 layers with Inception-like branching, 3 devices: the integer program stays fast."""
    import time

    rng = random.Random(7)
    layers = [f"l{i}" for i in range(300)]
    devices = ["cpu", "gpu", "tpu"]
    node = {(l, d): rng.uniform(0.1, 5) for l in layers for d in devices}
    tensors = [Tensor("/input/x", (layers[0],), 1000)]
    for i, layer in enumerate(layers[:-1]):
        fan = [layers[j] for j in range(i + 1, min(i + 4, len(layers))) if j == i + 1 or rng.random() < 0.3]
        tensors.append(Tensor(layer, tuple(fan), rng.randint(100, 10**6)))
    tensors.append(Tensor(layers[-1], ("/output",), 20))
    problem = Problem(layers, devices, "cpu", node, tensors, lambda s, d, n: 0.0 if s == d else 0.01 + n * 1e-7)
    solve_milp(random_problem(0, 3, devices))  # import and warm up HiGHS
    start = time.perf_counter()
    best = solve(problem)
    assert time.perf_counter() - start < 3.0  # typically ~0.4 s on 2 cores
    assert math.isfinite(best.cost) and best.method.startswith("integer program")


def _unlinked(problem, pairs):
    """The problem with no timed copy for each (from, to) device pair in ``pairs`` (an infinite cost)."""
    inner = problem.transfer_cost
    return Problem(problem.layers, problem.devices, problem.host, problem.node_cost, problem.tensors,
                   lambda s, d, n: math.inf if (s, d) in pairs else inner(s, d, n))


@pytest.mark.parametrize("seed", range(8))
def test_copies_never_timed_and_nan_costs_are_forbidden_in_every_solver(seed):
    """Issue 30 item 5: an unlinked device pair (two predicted GPUs) or a NaN time reached HiGHS as an
    infinite coefficient (milp: 'c must be ... finite'), and zeroed every min-cut capacity."""
    three = ["cpu", "a100", "t4"]
    unlinked = {("a100", "t4"), ("t4", "a100")}
    dag = _unlinked(random_problem(seed, 6, three, infeasible=0.3), unlinked)
    dag.node_cost[("l1", "t4")] = math.nan  # e.g. an unknown time x a price of 0
    chain = _unlinked(random_problem(seed, 6, three, chain=True, infeasible=0.3), unlinked)
    chain.node_cost[("l2", "a100")] = math.nan
    two = _unlinked(random_problem(seed, 7, ["cpu", "t4"]), {("t4", "cpu")} if seed % 2 else {("cpu", "t4")})
    for problem, solver in ((Problem(**vars(dag)), solve_milp), (Problem(**vars(chain)), solve_chain),
                            (Problem(**vars(two)), solve_two_devices)):
        got, best = solver(problem), brute_force(problem)
        if math.isfinite(best.cost):
            assert got.cost == pytest.approx(best.cost, rel=1e-6)
            assert problem.cost_of(got.placement) == pytest.approx(got.cost)
        else:
            assert not got.placement and not math.isfinite(got.cost)


def test_a_placement_no_timed_copy_allows_is_one_line_naming_the_layer():
    """b runs only on t4, a (which feeds it) only on a100, and a100 -> t4 was never timed: every solver finds
    nothing, and blocked_layer names the layer and why."""
    from tbs.place.blocked import blocked_layer

    devices = ["cpu", "a100", "t4"]
    node = {("a", "cpu"): INFEASIBLE, ("a", "a100"): 1.0, ("a", "t4"): INFEASIBLE,
            ("b", "cpu"): INFEASIBLE, ("b", "a100"): INFEASIBLE, ("b", "t4"): 1.0,
            ("c", "cpu"): 1.0, ("c", "a100"): 1.0, ("c", "t4"): 1.0}
    tensors = [Tensor("/input/x", ("a",), 10), Tensor("a", ("b", "c"), 10), Tensor("b", ("c",), 10),
               Tensor("c", ("/output",), 10)]
    linked = {("cpu", "a100"), ("a100", "cpu"), ("cpu", "t4"), ("t4", "cpu")}
    problem = Problem(["a", "b", "c"], devices, "cpu", node, tensors,
                      lambda s, d, n: 0.0 if s == d else 1.0 if (s, d) in linked else math.inf)
    assert not solve_milp(problem).placement and not solve(problem).placement
    layer, why = blocked_layer(problem)
    assert layer in ("a", "b") and "no copy between those devices was timed" in why
    assert ("only on a100" in why and "'b'" in why) if layer == "a" else ("only on t4" in why and "'a'" in why)
    node[("b", "a100")] = 2.0  # now b can follow a
    problem = Problem(["a", "b", "c"], devices, "cpu", node, tensors, problem.transfer_cost)
    assert blocked_layer(problem) is None and solve(problem).placement["b"] == "a100"
    pair = Problem(["a", "b"], ["cpu", "t4"], "cpu", {("a", "cpu"): INFEASIBLE, ("a", "t4"): 1.0,
                                                     ("b", "cpu"): 1.0, ("b", "t4"): INFEASIBLE},
                   [Tensor("/input/x", ("a", "b"), 1), Tensor("a", ("b",), 1), Tensor("b", ("/output",), 1)],
                   lambda s, d, n: 0.0 if s == d else math.inf if (s, d) == ("t4", "cpu") else 1.0)
    assert not solve_two_devices(pair).placement and blocked_layer(pair)[0] in ("a", "b")
