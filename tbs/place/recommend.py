"""From a profile to a placement recommendation: solve the problem, compare with every single device.

What is placed comes from ``data`` (``gather``: one batch's times, prices, tensors, copy costs,
memory); the answer is a ``result.Recommendation``. Objectives:
- time: seconds per batch, layers plus transfers;
- cost, metered billing: each device is paid only for the seconds it works
  (a transfer is paid at the receiving device's price, which waits for it);
- cost, dedicated billing: every device used is paid for the whole run
  (price of the set x latency), solved exactly by trying each device subset.

In a training profile a layer's time is its whole train step (forward, backward and
update on one device), the loss is a placed node fed by the model's outputs, and a
tensor that crosses devices is paid twice: the activation forward and, where a
gradient flows back along its edge, the gradient the other way (same bytes).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from tbs.cost.reprice import usd_per_batch
from tbs.errors import TbsError
from tbs.place.data import PlacementData, check_placeable, gather
from tbs.place.result import Evaluation, Recommendation
from tbs.place.blocked import blocked_layer
from tbs.place.solvers import INFEASIBLE, Problem, Solution, solve, solve_milp
from tbs.profiles.profile import Profile


def problem_of(inp: PlacementData, node_cost: dict[tuple[str, str], float],
               transfer_cost: Callable[[str, str, int], float], dispatch: dict[str, float]) -> Problem:
    """The problem with each program call's dispatch priced: the first layer's device pays one, and where a split
    is a call per run of layers on one device, each device change pays the new device's (order tensors)."""
    first = inp.layers[0] if inp.layers else None
    cost = {k: v + (dispatch.get(k[1], 0.0) if k[0] == first else 0.0) for k, v in node_cost.items()}
    return Problem(inp.layers, inp.devices, inp.host, cost, inp.tensors + inp.order_tensors(), transfer_cost, dispatch)


def time_problem(inp: PlacementData, allowed: list[str] | None = None) -> Problem:
    allowed = allowed or inp.devices
    cost = {(l, d): (inp.seconds[(l, d)] if d in allowed else INFEASIBLE) for l in inp.layers for d in inp.devices}
    return problem_of(inp, cost, inp.transfer_seconds, inp.dispatch_seconds)


def metered_cost_problem(inp: PlacementData) -> Problem:
    """USD per batch; a layer on an unpriced device, or with no time, is infeasible (never inf x 0 = NaN)."""
    def usd(d: str) -> float | None:
        return usd_per_batch(1.0, inp.usd_per_hour.get(d))

    def times_price(seconds: float, price: float | None) -> float:
        return seconds * price if math.isfinite(seconds) and price is not None else INFEASIBLE

    cost = {(l, d): times_price(inp.seconds[(l, d)], usd(d)) for l in inp.layers for d in inp.devices}
    dispatch = {d: times_price(s, usd(d) or 0.0) for d, s in inp.dispatch_seconds.items()}
    return problem_of(inp, cost, lambda s, d, n: 0.0 if s == d else times_price(inp.transfer_seconds(s, d, n),
                                                                                 usd(d) or 0.0), dispatch)


def evaluate(inp: PlacementData, name: str, placement: dict[str, str], billing: str) -> Evaluation:
    seconds = time_problem(inp).cost_of(placement)
    if billing == "dedicated":
        used = set(placement.values())
        prices = [inp.usd_per_hour.get(d) for d in used]
        usd = None if any(p is None for p in prices) else usd_per_batch(seconds, sum(prices))
    else:
        priced = all(inp.usd_per_hour.get(d) is not None for d in set(placement.values()))
        usd = metered_cost_problem(inp).cost_of(placement) if priced else None
    return Evaluation(name, placement, seconds, usd)


def _dedicated(inp: PlacementData) -> Solution:
    best: Solution | None = None
    priced = [d for d in inp.devices if inp.usd_per_hour.get(d) is not None]
    for k in range(1, len(priced) + 1):
        for subset in itertools.combinations(priced, k):
            sol = solve(time_problem(inp, list(subset)))
            if not sol.placement or not math.isfinite(sol.cost):
                continue
            usd = usd_per_batch(sol.cost, sum(inp.usd_per_hour[d] for d in set(sol.placement.values())))
            if best is None or usd < best.cost:
                best = Solution(sol.placement, usd, f"{sol.method} per device subset (dedicated billing)")
    if best is None:
        raise TbsError("no device set with prices can run every layer; give prices with --cost")
    return best


def recommend(profile: Profile, objective: str = "cost", batch_size: int | None = None, billing: str = "metered",
              max_latency_ms: float | None = None, budget_usd_per_1m: float | None = None,
              with_frontier: bool = True) -> Recommendation:
    """The placement; ``with_frontier=False`` skips the 13 extra solves of the cost-latency frontier
    (the prediction bands' re-solves need only the placement)."""
    inp = gather(profile, batch_size)
    priced = [d for d in inp.devices if inp.usd_per_hour.get(d) is not None]
    if objective == "cost" and not priced:
        raise TbsError("objective cost needs prices: pass --cost cpu=0.5,gpu=3 (prices={'cpu': 0.5, 'gpu': 3} "
                       "in Python), or minimise time")
    check_placeable(inp, objective)
    if objective == "cost" and billing == "dedicated":
        solution = _dedicated(inp)
    else:
        problem = time_problem(inp) if objective == "time" else metered_cost_problem(inp)
        constraint = None
        if max_latency_ms is not None and objective == "cost":
            t = time_problem(inp)
            constraint = _linear_weights(t, max_latency_ms / 1000.0)
        elif budget_usd_per_1m is not None and objective == "time":
            c = metered_cost_problem(inp)
            constraint = _linear_weights(c, budget_usd_per_1m * inp.batch_size / 1e6)
        solution = solve_milp(problem, constraint) if constraint else solve(problem)
        memory_bound = bool(solution.placement and inp.memory is not None and inp.memory.over(solution.placement))
        if memory_bound:
            solution = solve_milp(problem, constraint, inp.memory.constraints(inp.layers, inp.devices))
        if not solution.placement or not math.isfinite(solution.cost):
            raise TbsError(_no_placement(inp, problem, constraint is not None, memory_bound))
    chosen = evaluate(inp, "recommended", solution.placement, billing)
    singles = []
    for d in inp.devices:
        placement = {l: d for l in inp.layers}
        fits = inp.memory is None or not inp.memory.over(placement)
        if fits and all(math.isfinite(inp.seconds[(l, d)]) for l in inp.layers):
            single = evaluate(inp, f"all on {d}", placement, billing)
            if math.isfinite(single.seconds_per_batch):  # else: copies to d were never measured
                singles.append(single)
    base = time_problem(inp) if objective == "time" else metered_cost_problem(inp)
    argmin_placement = {l: min(inp.devices, key=lambda d: base.node_cost[(l, d)]) for l in inp.layers}
    argmin = evaluate(inp, "per-layer argmin", argmin_placement, billing)
    argmin = argmin if math.isfinite(argmin.seconds_per_batch) else None
    rec = Recommendation(objective, billing, inp, chosen, solution.method, singles, argmin)
    rec.frontier = frontier(inp, billing) if priced and with_frontier else []
    return rec


def _no_placement(inp: PlacementData, problem: Problem, constrained: bool, memory_bound: bool) -> str:
    """Why the solver found nothing, though every layer runs somewhere: a layer no timed copy can reach,
    the cap, memory, or copies never timed."""
    blocked = blocked_layer(problem)
    if blocked is not None:
        layer, why = blocked
        return (f"layer '{layer}' cannot be placed at batch {inp.batch_size}: {why}; profile those devices "
                f"together (tbs profile --devices ...) or recommend without the device it cannot reach")
    if constrained:
        return "no placement meets the constraint; relax --max-latency or --budget (max_latency_ms, budget_usd_per_1m)"
    if memory_bound:
        return f"no placement fits the devices' memory at batch {inp.batch_size}; recommend a smaller batch (--batch)"
    return ("no placement: the layers run on different devices and the copies between them were never timed; "
            "profile those devices together in one run (tbs profile --devices ...)")


def _linear_weights(problem: Problem, bound: float) -> tuple[dict, dict, float]:
    """Σ node + Σ transfer of ``problem`` as MILP weights, with its bound."""
    node = {k: v for k, v in problem.node_cost.items() if math.isfinite(v)}
    edges = {}
    for ti, t in enumerate(problem.tensors):
        for s in problem.devices:
            for d in problem.devices:
                if s != d:
                    edges[(ti, s, d)] = problem.copy_cost(t, s, d)  # inf: solve_milp forbids that copy
    return node, edges, bound


def frontier(inp: PlacementData, billing: str) -> list[Evaluation]:
    """Placements that are best for some cost-time trade-off (weighted sums, Pareto-filtered)."""
    t_problem, c_problem = time_problem(inp), metered_cost_problem(inp)
    found: dict[tuple, Evaluation] = {}
    for weight in np.logspace(-6, 6, 13):
        combined = Problem(
            inp.layers, inp.devices, inp.host,
            {k: t_problem.node_cost[k] * weight + c_problem.node_cost[k] for k in t_problem.node_cost},
            t_problem.tensors,
            lambda s, d, n, w=weight: t_problem.transfer_cost(s, d, n) * w + c_problem.transfer_cost(s, d, n),
            {d: t_problem.dispatch[d] * weight + c_problem.dispatch.get(d, 0.0) for d in t_problem.dispatch})
        sol = solve(combined)
        if sol.placement and math.isfinite(sol.cost):
            key = tuple(sol.placement[l] for l in inp.layers)
            found.setdefault(key, evaluate(inp, "frontier", sol.placement, billing))
    points = [e for e in found.values() if e.usd_per_batch is not None]
    return sorted([e for e in points if not any(
        o.seconds_per_batch <= e.seconds_per_batch and o.usd_per_batch <= e.usd_per_batch
        and (o.seconds_per_batch < e.seconds_per_batch or o.usd_per_batch < e.usd_per_batch) for o in points)],
        key=lambda e: e.seconds_per_batch)
