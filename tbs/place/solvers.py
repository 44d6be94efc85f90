"""Exact device placement: which device each layer should run on, transfers included.

The problem: layers (a DAG in execution order), a cost per (layer, device) —
``INFEASIBLE`` where the device cannot run the layer — and tensors flowing along
edges. A cost that is not a finite number (never measured or predicted, out of memory,
a copy between two devices never timed) is a forbidden assignment: the solvers leave
that variable out or bound it to 0, so no infinite or NaN coefficient ever reaches one.
A tensor produced on device a and consumed on device b costs one transfer
a→b, charged once per destination device however many consumers it has there.
Model inputs start on, and outputs return to, the host. In training a gradient
flows back along an edge: it is a tensor of its own (``grad``) whose copy goes the
other way, b→a, once per consumer device (its consumers' gradients are summed
there first), so every solver below stays exact with forward and backward copies.

Solvers, all exact:
- a chain (each layer feeds only the next): dynamic programming over layers x devices;
- two devices on a DAG: an s-t minimum cut (scipy's maximum flow), with one
  auxiliary node per tensor and direction so a transfer is paid once;
- three or more devices, or a side constraint: an integer program (scipy.optimize.milp, HiGHS).
``brute_force`` checks them on small graphs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tbs.endpoints import GRAPH_OUTPUT, is_input_endpoint

INFEASIBLE = math.inf


@dataclass(frozen=True)
class Tensor:
    """One tensor: produced by ``src`` (a layer, or a model input ``/input/<name>`` on the host), read by
    ``consumers`` (layers, or ``/output``: back to the host).

    ``grad``: the gradient of that tensor, flowing back from the consumers' devices to
    ``src``'s (same bytes, opposite direction).
    """

    src: str
    consumers: tuple[str, ...]
    bytes: int
    grad: bool = False
    # A zero-byte link from one call to the next in call order: where a split runs one program call per run of
    # layers on one device, crossing it to another device starts a program there, which costs that device's dispatch.
    order: bool = False


@dataclass
class Problem:
    layers: list[str]
    devices: list[str]
    host: str
    node_cost: dict[tuple[str, str], float]  # (layer, device) -> cost, INFEASIBLE where it cannot run
    tensors: list[Tensor]
    transfer_cost: Callable[[str, str, int], float]  # (from, to, bytes) -> cost; 0 when from == to
    dispatch: dict[str, float] = field(default_factory=dict)  # device -> one program call's cost there (order tensors)

    def __post_init__(self) -> None:
        # NaN (e.g. an unknown time x a price of 0) compares false with everything: forbidden, like inf
        self.node_cost = {k: (v if math.isfinite(v) else INFEASIBLE) for k, v in self.node_cost.items()}

    def runs_on(self, layer: str) -> list[str]:
        """The devices that can run ``layer`` (a finite cost there)."""
        return [d for d in self.devices if math.isfinite(self.node_cost[(layer, d)])]

    def copy_cost(self, t: Tensor, src_device: str, consumer_device: str) -> float:
        """Moving ``t`` between its producer's device and a consumer's: forward, or a gradient back."""
        if src_device == consumer_device:
            return 0.0
        if t.order:
            return self.dispatch.get(consumer_device, 0.0)
        if t.grad:
            value = self.transfer_cost(consumer_device, src_device, t.bytes)
        else:
            value = self.transfer_cost(src_device, consumer_device, t.bytes)
        return value if math.isfinite(value) else INFEASIBLE  # a copy never timed: that pair is forbidden

    def cost_of(self, placement: dict[str, str]) -> float:
        """Total cost of a placement: layers plus transfers (once per tensor and destination)."""
        total = sum(self.node_cost[(layer, placement[layer])] for layer in self.layers)
        for t in self.tensors:
            here = self.host if is_input_endpoint(t.src) else placement[t.src]
            destinations = {self.host if c == GRAPH_OUTPUT else placement[c] for c in t.consumers}
            total += sum(self.copy_cost(t, here, d) for d in destinations if d != here)
        return total


@dataclass
class Solution:
    placement: dict[str, str]
    cost: float
    method: str


def is_chain(problem: Problem) -> bool:
    """Every tensor goes from one layer (or the input) to the next one only."""
    order = {name: i for i, name in enumerate(problem.layers)}
    for t in problem.tensors:
        src = -1 if is_input_endpoint(t.src) else order[t.src]
        for c in t.consumers:
            dst = len(problem.layers) if c == GRAPH_OUTPUT else order[c]
            if dst != src + 1:
                return False
    return True


def brute_force(problem: Problem) -> Solution:
    """Every assignment; only for small problems (tests)."""
    best: tuple[float, dict[str, str]] = (math.inf, {})
    for combo in itertools.product(problem.devices, repeat=len(problem.layers)):
        placement = dict(zip(problem.layers, combo))
        cost = problem.cost_of(placement)
        if cost < best[0]:
            best = (cost, placement)
    return Solution(best[1], best[0], "brute force")


def solve_chain(problem: Problem) -> Solution:
    """Viterbi over layers x devices for a chain (a layer's activation and, in training, its gradient).

    Only the (layer, device) states a device can run and reach by copies that were timed are
    kept: a forbidden state or step is left out, never carried as an infinite cost.
    """
    incoming: dict[str, list[Tensor]] = {}
    for t in problem.tensors:
        for c in t.consumers:
            incoming.setdefault(c, []).append(t)

    def copies(layer: str, src_device: str, device: str) -> float:
        return sum(problem.copy_cost(t, src_device, device) for t in incoming.get(layer, []))

    best: dict[str, float] = {problem.host: 0.0}  # before the first layer, the input sits on the host
    back: list[dict[str, str]] = []
    for layer in problem.layers:
        row, pointer = {}, {}
        for d in problem.runs_on(layer):
            options = {p: best[p] + copies(layer, p, d) for p in best}
            options = {p: v for p, v in options.items() if math.isfinite(v)}
            if options:
                p = min(options, key=options.get)
                row[d], pointer[d] = problem.node_cost[(layer, d)] + options[p], p
        if not row:
            return Solution({}, INFEASIBLE, "dynamic programming (chain, infeasible)")
        best = row
        back.append(pointer)
    final = {d: best[d] + copies(GRAPH_OUTPUT, d, problem.host) for d in best}
    final = {d: v for d, v in final.items() if math.isfinite(v)}
    if not final:
        return Solution({}, INFEASIBLE, "dynamic programming (chain, infeasible)")
    d = min(final, key=final.get)
    cost = final[d]
    placement = {}
    for i in range(len(problem.layers) - 1, -1, -1):
        placement[problem.layers[i]] = d
        d = back[i][d]
    placement = {layer: placement[layer] for layer in problem.layers}
    return Solution(placement, cost, "dynamic programming (chain)")


def solve_two_devices(problem: Problem) -> Solution:
    """Exact s-t minimum cut for two devices on a DAG (source side = devices[0])."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    a, b = problem.devices
    values = [*problem.node_cost.values(), *(problem.copy_cost(t, x, y) for t in problem.tensors
                                             for x, y in ((a, b), (b, a)))]
    # scipy's max flow takes int32 capacities: all finite capacities together stay under 5e8
    # (so any finite cut is below `big`), a rounding of ~1e-9 of the total. A forbidden
    # assignment or copy is an edge of capacity `big`, which no finite cut crosses.
    scale = 5e8 / max(sum(v for v in values if math.isfinite(v)), 1e-30)
    big = 2_000_000_000

    def cap(value: float) -> int:
        return big if not math.isfinite(value) else int(round(value * scale))

    # Nodes by number (a layer may be called "s", "t" or "host"): s, t, the layers, the host, then auxiliaries.
    s, t_node, host = 0, 1, len(problem.layers) + 2
    index = {layer: i + 2 for i, layer in enumerate(problem.layers)}
    edges: dict[tuple[int, int], int] = {}

    def add(u: int, v: int, c: int) -> None:
        edges[(u, v)] = min(edges.get((u, v), 0) + c, big)

    for layer in problem.layers:
        add(s, index[layer], cap(problem.node_cost[(layer, b)]))  # cut when the layer sits on b
        add(index[layer], t_node, cap(problem.node_cost[(layer, a)]))  # cut when it sits on a
    add(s if problem.host == a else host, host if problem.host == a else t_node, big)  # pin the host
    aux = host + 1
    for t in problem.tensors:
        src = host if is_input_endpoint(t.src) else index[t.src]
        consumers = [host if c == GRAPH_OUTPUT else index[c] for c in t.consumers]
        # src on a, some consumer on b: pay a->b once (aux node between them); a gradient pays b->a
        add(src, aux, cap(problem.copy_cost(t, a, b)))
        for c in consumers:
            add(aux, c, big)
        # src on b, some consumer on a: pay b->a once (a gradient: a->b)
        add(aux + 1, src, cap(problem.copy_cost(t, b, a)))
        for c in consumers:
            add(c, aux + 1, big)
        aux += 2
    size = aux
    rows, cols, caps = zip(*[(u, v, c) for (u, v), c in edges.items()])
    graph = csr_matrix((np.asarray(caps, dtype=np.int32), (rows, cols)), shape=(size, size))
    flow = maximum_flow(graph, s, t_node).flow
    residual = graph.toarray() - flow.toarray()  # flow is skew-symmetric: reverse edges included
    seen, stack = {s}, [s]
    while stack:
        u = stack.pop()
        for v in np.nonzero(residual[u] > 0)[0]:
            if v not in seen:
                seen.add(int(v))
                stack.append(int(v))
    placement = {layer: (a if index[layer] in seen else b) for layer in problem.layers}
    cost = problem.cost_of(placement)
    if not math.isfinite(cost):  # every cut crosses a forbidden edge
        return Solution({}, INFEASIBLE, "minimum cut (two devices, infeasible)")
    return Solution(placement, cost, "minimum cut (two devices)")


class _Rows:
    """Linear constraint rows low <= coefs . v <= high, built one at a time into a sparse matrix
    (a dense one is rows x variables: ~3M entries for ResNet50 on three devices, most of a solve's time)."""

    def __init__(self, n: int) -> None:
        self.n, self.lo, self.hi = n, [], []  # type: ignore[var-annotated]
        self.row_index: list[int] = []
        self.columns: list[int] = []
        self.values: list[float] = []

    def add(self, coefs: dict[int, float], low: float, high: float) -> None:
        self.row_index += [len(self.lo)] * len(coefs)
        self.columns += list(coefs)
        self.values += list(coefs.values())
        self.lo.append(low)
        self.hi.append(high)

    def matrix(self):  # scipy.sparse.csr_matrix (duplicates summed)
        from scipy.sparse import csr_matrix

        return csr_matrix((self.values, (self.row_index, self.columns)), shape=(len(self.lo), self.n))


def _milp_variables(problem: Problem) -> dict[tuple, int]:
    """x[l,d] = layer l on device d; z[t,s,d] = tensor t made on s and read on d (a gradient: sent d to s)."""
    var: dict[tuple, int] = {}
    for l in problem.layers:
        for d in problem.devices:
            var[("x", l, d)] = len(var)
    for ti, _ in enumerate(problem.tensors):
        for s in problem.devices:
            for d in problem.devices:
                if s != d:
                    var[("z", ti, s, d)] = len(var)
    return var


def _milp_objective(problem: Problem, var: dict[tuple, int]) -> tuple[np.ndarray, np.ndarray]:
    """Costs per variable, and upper bounds: 0 (forbidden, cost 0) where a layer cannot run on a
    device or a copy between two devices was never timed; no coefficient is ever infinite."""
    c, upper = np.zeros(len(var)), np.ones(len(var))

    def set_cost(key: tuple, cost: float) -> None:
        if math.isfinite(cost):
            c[var[key]] = cost
        else:
            upper[var[key]] = 0.0

    for l in problem.layers:
        for d in problem.devices:
            set_cost(("x", l, d), problem.node_cost[(l, d)])
    for ti, t in enumerate(problem.tensors):
        for s in problem.devices:
            for d in problem.devices:
                if s != d:
                    set_cost(("z", ti, s, d), problem.copy_cost(t, s, d))
    return c, upper


def _endpoint(problem: Problem, var: dict[tuple, int], coefs: dict[int, float], name: str, device: str,
              sign: float, on_host: bool) -> float:
    """Add sign * x[name, device] to coefs; an end fixed on the host (model input or output) is a constant."""
    if on_host:
        return sign if device == problem.host else 0.0
    key = var[("x", name, device)]
    coefs[key] = coefs.get(key, 0.0) + sign
    return 0.0


def _transfer_rows(problem: Problem, var: dict[tuple, int], rows: _Rows) -> None:
    """A copy s->d is paid when the source is on s and a consumer on d; plus a tightening cut."""
    devices = problem.devices
    for ti, t in enumerate(problem.tensors):
        for s in devices:
            for d in devices:
                if s == d:
                    continue
                for consumer in t.consumers:
                    coefs: dict[int, float] = {var[("z", ti, s, d)]: 1.0}
                    # z - x_src,s - x_c,d >= -1  (constants move to the bound)
                    constant = -_endpoint(problem, var, coefs, t.src, s, -1.0, is_input_endpoint(t.src))
                    constant -= _endpoint(problem, var, coefs, consumer, d, -1.0, consumer == GRAPH_OUTPUT)
                    rows.add(coefs, -1.0 + constant, math.inf)
        # Tightening (same integer points, stronger LP): needed on d and not made on d ->
        # some source pays:  Σ_s z[t,s,d] + x[src,d] - x[c,d] >= 0
        for d in devices:
            for consumer in t.consumers:
                coefs = {var[("z", ti, s, d)]: 1.0 for s in devices if s != d}
                constant = -_endpoint(problem, var, coefs, t.src, d, 1.0, is_input_endpoint(t.src))
                constant -= _endpoint(problem, var, coefs, consumer, d, -1.0, consumer == GRAPH_OUTPUT)
                rows.add(coefs, constant, math.inf)


def solve_milp(problem: Problem, extra_constraint: tuple[dict[tuple[str, str], float], dict, float] | None = None,
               more: list[tuple[dict[tuple[str, str], float], dict, float]] = ()) -> Solution:
    """Integer program (HiGHS). x[l,d] = layer l on d; z[t,s,d] >= x[src,s] + x[c,d] - 1 pays s->d once.

    ``extra_constraint`` = (per (layer, device) weights, per (tensor index, s, d) weights, bound):
    Σ w·x + Σ v·z <= bound, for latency or budget caps; ``more`` adds rows of the same form
    (device memory).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    var = _milp_variables(problem)
    c, upper = _milp_objective(problem, var)
    # HiGHS's tolerances are absolute (1e-7): at seconds or USD a batch (1e-10 to 1e-3) most copies looked free and
    # the "optimal" placement was not. Costs and each cap's row are scaled to at most 1; the placement is the same.
    c = c / (float(np.abs(c).max()) or 1.0)
    rows = _Rows(len(var))
    for l in problem.layers:
        rows.add({var[("x", l, d)]: 1.0 for d in problem.devices}, 1.0, 1.0)
    _transfer_rows(problem, var, rows)
    for node_w, edge_w, bound in ([extra_constraint] if extra_constraint is not None else []) + list(more):
        weights = [(var[("x", l, d)], w) for (l, d), w in node_w.items() if ("x", l, d) in var]
        weights += [(var[("z", ti, s, d)], w) for (ti, s, d), w in edge_w.items()]
        coefs: dict[int, float] = {}
        for k, w in weights:
            if math.isfinite(w):
                coefs[k] = coefs.get(k, 0.0) + w
            else:  # a variable the cap cannot count (e.g. a copy never timed) is forbidden, not weighted by inf
                upper[k] = 0.0
        top = max((abs(v) for v in coefs.values()), default=0.0) or 1.0
        rows.add({k: v / top for k, v in coefs.items()}, -math.inf, bound / top)
    result = milp(c, constraints=LinearConstraint(rows.matrix(), rows.lo, rows.hi),
                  integrality=np.ones(len(var)), bounds=Bounds(np.zeros(len(var)), upper))
    if result.x is None:
        return Solution({}, math.inf, "integer program (infeasible)")
    placement = {l: max(problem.devices, key=lambda d: result.x[var[("x", l, d)]]) for l in problem.layers}
    return Solution(placement, problem.cost_of(placement), "integer program (HiGHS)")


def solve(problem: Problem) -> Solution:
    """The exact solver that fits the problem's shape."""
    if is_chain(problem):
        return solve_chain(problem)
    if len(problem.devices) == 2:
        return solve_two_devices(problem)
    return solve_milp(problem)
