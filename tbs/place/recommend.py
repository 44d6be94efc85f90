"""From a profile to a placement recommendation: build the problem, solve it, compare.

Per-layer times come from the profile (status ok/noisy; failed, OOM or CPU-fallback
cells are infeasible on that device), tensors and bytes from its layer graph,
copy costs from its measured transfer fits. Objectives:
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tbs.cost.reprice import lookup, usd_per_batch
from tbs.schema import LOSS_LAYER, MEASURED, is_input_endpoint
from tbs.units import is_number
from tbs.errors import TbsError
from tbs.place.solvers import INFEASIBLE, Problem, Solution, Tensor, blocked_layer, solve, solve_milp
from tbs.profiles.profile import Profile
from tbs.measure.transfers import TransferFit, pair_key
from tbs.place.graph import bypass, graph_tensors
from tbs.place.batch import choose_batch, usable
from tbs.place.memory import MemoryLimits, limits_for


@dataclass
class PlacementData:
    """Everything the optimiser placed from (times, prices, tensors, memory), so anyone can check the answer.

    Not the model's inputs: the placement problem's data (``Recommendation.data``; JSON ``inputs``).
    """

    batch_size: int
    layers: list[str]
    devices: list[str]
    host: str
    seconds: dict[tuple[str, str], float]
    usd_per_hour: dict[str, float | None]
    tensors: list[Tensor]
    fits: dict[str, TransferFit]
    mode: str = "inference"
    memory: MemoryLimits | None = None  # device memory as a hard limit (None: no sizes known)
    # Why a (layer, device) cannot be placed, where it cannot: what the user is told when nothing fits.
    why_not: dict[tuple[str, str], str] = field(default_factory=dict)
    # Set when no --batch was given and larger profiled batches were passed over (choose_batch): printed.
    batch_note: str = ""

    def transfer_seconds(self, src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        fit = self.fits.get(pair_key(src, dst))
        return INFEASIBLE if fit is None else fit.seconds(nbytes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "batch_size": self.batch_size, "host": self.host, "devices": self.devices,
            "usd_per_hour": self.usd_per_hour,
            "layer_seconds": {l: {d: (None if not math.isfinite(self.seconds[(l, d)]) else self.seconds[(l, d)])
                                  for d in self.devices} for l in self.layers},
            "tensors": [{"src": t.src, "consumers": list(t.consumers), "bytes": t.bytes,
                         **({"grad": True} if t.grad else {})} for t in self.tensors],
            "transfer_fits": {k: f.as_dict() for k, f in self.fits.items()},
        }


def _times(rows: pd.DataFrame, layers: list[str], devices: list[str], predicted: set[str]
           ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], str]]:
    """Each (layer, device)'s time at the batch, and why the ones without a usable time have none."""
    seconds = {(l, d): INFEASIBLE for l in layers for d in devices}
    why_not = {(l, d): "not predicted" if d in predicted else "not measured" for l in layers for d in devices}
    for r, timed in zip(rows.itertuples(index=False), usable(rows)):
        if timed:
            seconds[(r.layer, r.device)] = float(r.median_s)
            why_not.pop((r.layer, r.device), None)
        else:
            reason = r.reason if isinstance(r.reason, str) and r.reason else "no time"
            why_not[(r.layer, r.device)] = reason if r.status in MEASURED else f"{r.status}: {reason}"
    return seconds, why_not


def gather(profile: Profile, batch_size: int | None) -> PlacementData:
    summary = profile.summary
    if summary.empty:
        raise TbsError(f"'{profile.directory}' has no measured layers")
    records = profile.layers
    layers = [l.name for l in records if l.in_step is not False]  # what the compiled step never runs: no node
    skipped = [l.name for l in records if l.in_step is False]
    if profile.mode == "training" and LOSS_LAYER not in layers and (summary["layer"] == LOSS_LAYER).any():
        layers.append(LOSS_LAYER)  # the loss is placed like a layer
    batches = sorted({int(b) for b in summary["batch_size"]})
    batch, batch_note = (batch_size, "") if batch_size is not None else choose_batch(summary, layers)
    if batch not in batches:
        raise TbsError(f"batch size {batch} (--batch) is not in this profile: it has {', '.join(map(str, batches))}")
    rows = summary[summary["batch_size"] == batch]
    devices = sorted(rows["device"].unique())
    predicted = set(profile.meta.predicted_devices)
    seconds, why_not = _times(rows, layers, devices, predicted)
    kinds = dict(zip(rows["device"], rows["device_kind"]))
    prices = profile.meta.prices_usd_per_hour
    usd = {d: (float(p) if is_number(p) else None) for d, p in
           rows.groupby("device")["usd_per_hour"].first().items()} if "usd_per_hour" in rows else {}
    for d in devices:
        if usd.get(d) is None:  # a predicted device takes no price from the kind of a measured one
            usd[d] = lookup(prices, d, None if d in predicted else kinds.get(d, ""))
    host = profile.meta.host_device or next((d for d in devices if kinds.get(d) == "cpu"), devices[0])
    edges = profile.meta.graph.get(str(batch), [])
    tensors = graph_tensors(bypass(edges, skipped), layers, profile.mode)
    fits = {k: TransferFit(v["alpha_s"], v["beta_s_per_byte"]) for k, v in profile.meta.transfers.items()}
    memory = limits_for(profile, rows, batch)
    for l in layers:
        for d in devices:
            if not memory.fits_alone(l, d):  # its weights and activations alone exceed the device
                seconds[(l, d)] = INFEASIBLE
                why_not[(l, d)] = "its weights and activations do not fit in the device's memory"
    return PlacementData(batch, layers, devices, host, seconds, usd, tensors, fits, profile.mode, memory, why_not, batch_note)


def check_placeable(inp: PlacementData, objective: str) -> None:
    """Every layer needs a device that can run it (and, to minimise cost, a priced one): else one line naming it."""
    for layer in inp.layers:
        runs_on = [d for d in inp.devices if math.isfinite(inp.seconds[(layer, d)])]
        if not runs_on:
            why = "; ".join(f"{d}: {inp.why_not.get((layer, d), 'not measured')}" for d in inp.devices)
            raise TbsError(f"layer '{layer}' cannot be placed at batch {inp.batch_size}: no profiled device ran it "
                           f"({why}); fix the layer, or profile a device that runs it and recommend again")
        if objective == "cost" and not any(inp.usd_per_hour.get(d) is not None for d in runs_on):
            raise TbsError(f"layer '{layer}' runs only on {', '.join(runs_on)}, which has no price: give one with "
                           f"--cost (e.g. --cost {runs_on[0]}=0.5), or minimise time (--objective time)")


def time_problem(inp: PlacementData, allowed: list[str] | None = None) -> Problem:
    allowed = allowed or inp.devices
    cost = {(l, d): (inp.seconds[(l, d)] if d in allowed else INFEASIBLE) for l in inp.layers for d in inp.devices}
    return Problem(inp.layers, inp.devices, inp.host, cost, inp.tensors, inp.transfer_seconds)


def metered_cost_problem(inp: PlacementData) -> Problem:
    """USD per batch; a layer on an unpriced device, or with no time, is infeasible (never inf x 0 = NaN)."""
    def usd(d: str) -> float | None:
        return usd_per_batch(1.0, inp.usd_per_hour.get(d))

    def times_price(seconds: float, price: float | None) -> float:
        return seconds * price if math.isfinite(seconds) and price is not None else INFEASIBLE

    cost = {(l, d): times_price(inp.seconds[(l, d)], usd(d)) for l in inp.layers for d in inp.devices}
    return Problem(inp.layers, inp.devices, inp.host, cost, inp.tensors,
                   lambda s, d, n: 0.0 if s == d else times_price(inp.transfer_seconds(s, d, n), usd(d) or 0.0))


TRAINING_NOTE = ("training: forward, backward and update of each layer on one device; "
                 "activations move forward and gradients back")


@dataclass
class Evaluation:
    name: str
    placement: dict[str, str]
    seconds_per_batch: float
    usd_per_batch: float | None

    def per_sample(self, batch: int) -> dict[str, float | None]:
        return {"seconds_per_sample": self.seconds_per_batch / batch,
                "usd_per_sample": None if self.usd_per_batch is None else self.usd_per_batch / batch,
                "usd_per_1m_samples": None if self.usd_per_batch is None else self.usd_per_batch / batch * 1e6}


@dataclass
class Recommendation:
    objective: str
    billing: str
    data: PlacementData  # what the solvers placed from (was ``inputs``: still readable by that name)
    chosen: Evaluation
    method: str
    single_devices: list[Evaluation]
    argmin: Evaluation | None
    frontier: list[Evaluation] = field(default_factory=list)
    verification: Any = None  # a verify.Verification once the placement has been run for real
    # Whether predicted (not measured) devices took part, or were left out: every output prints it.
    predicted_note: str = ""
    # With predicted devices: per layer placed on one, or that the band could move (place.predicted.band_dependence).
    prediction_dependence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def inputs(self) -> PlacementData:
        """The old name of ``data``."""
        return self.data

    @property
    def batch_size(self) -> int:
        return self.data.batch_size

    @property
    def mode(self) -> str:
        return self.data.mode

    @property
    def mode_note(self) -> str:
        """What one placed layer stands for in this mode (the reports print it)."""
        if self.mode == "training":
            return TRAINING_NOTE
        return "inference: each layer's forward pass on one device; activations move forward"

    @property
    def placement(self) -> pd.DataFrame:
        """One row per layer: its device, predicted time and cost per sample, and the copies it waits for."""
        columns = ["layer", "device", "seconds_per_sample", "usd_per_sample", "transfer_in_seconds_per_sample"]
        if self.mode == "training":
            columns.append("gradient_in_seconds_per_sample")
        return pd.DataFrame(layer_rows(self), columns=columns)

    @property
    def comparison(self) -> pd.DataFrame:
        """The recommendation against every single device and per-layer argmin, per sample."""
        return pd.DataFrame(comparison(self))

    def __repr__(self) -> str:
        return (f"<tbs.Recommendation batch {self.batch_size}, minimise {self.objective} ({self.billing}): "
                f"{len(set(self.chosen.placement.values()))} device(s), {self.method}>")


def _copies_in(inp: PlacementData, placement: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per layer, seconds of activations copied in (once per tensor and device) and of gradients sent back to it."""
    forward = {layer: 0.0 for layer in inp.layers}
    backward = {layer: 0.0 for layer in inp.layers}
    order = {layer: i for i, layer in enumerate(inp.layers)}
    for t in inp.tensors:
        src = inp.host if is_input_endpoint(t.src) else placement[t.src]
        first_reader: dict[str, str] = {}
        for c in sorted((c for c in t.consumers if c in order), key=order.get):
            first_reader.setdefault(placement[c], c)
        for device, reader in first_reader.items():
            if device == src:
                continue
            if t.grad and t.src in backward:  # the producer waits for its gradient
                backward[t.src] += inp.transfer_seconds(device, src, t.bytes)
            elif not t.grad:  # the first reader on a device waits for the copy there
                forward[reader] += inp.transfer_seconds(src, device, t.bytes)
    return forward, backward


def layer_rows(rec: Recommendation) -> list[dict[str, Any]]:
    """Per layer: device, predicted seconds and USD per sample, and the copies it waits for per sample."""
    inp, placement, batch = rec.data, rec.chosen.placement, rec.data.batch_size
    forward, backward = _copies_in(inp, placement)
    rows = []
    for layer in inp.layers:
        device = placement[layer]
        seconds = inp.seconds[(layer, device)]
        usd = usd_per_batch(seconds, inp.usd_per_hour.get(device))
        row = {"layer": layer, "device": device, "seconds_per_sample": seconds / batch,
               "usd_per_sample": None if usd is None else usd / batch,
               "transfer_in_seconds_per_sample": forward[layer] / batch}
        if inp.mode == "training":
            row["gradient_in_seconds_per_sample"] = backward[layer] / batch
        rows.append(row)
    return rows


def saving(rec: Recommendation) -> dict[str, Any]:
    """The recommendation against the best single device, as a fraction and in USD per 1M samples."""
    key = "usd_per_batch" if rec.objective == "cost" else "seconds_per_batch"
    singles = [e for e in rec.single_devices if getattr(e, key) is not None]
    if not singles:
        return {}
    best = min(singles, key=lambda e: getattr(e, key))
    ours, theirs = getattr(rec.chosen, key), getattr(best, key)
    out = {"best_single_device": best.name, "saving_fraction": (theirs - ours) / theirs if theirs else 0.0}
    if rec.chosen.usd_per_batch is not None and best.usd_per_batch is not None:
        out["saving_usd_per_1m_samples"] = (best.usd_per_batch - rec.chosen.usd_per_batch) / rec.data.batch_size * 1e6
    return out


def comparison(rec: Recommendation) -> list[dict[str, Any]]:
    """The recommendation against every single device and per-layer argmin, per sample."""
    batch = rec.data.batch_size
    return [dict(name=e.name, **e.per_sample(batch))
            for e in [rec.chosen, *rec.single_devices, *([rec.argmin] if rec.argmin else [])]]


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
        combined = Problem(inp.layers, inp.devices, inp.host,
                           {k: t_problem.node_cost[k] * weight + c_problem.node_cost[k] for k in t_problem.node_cost},
                           inp.tensors,
                           lambda s, d, n, w=weight: t_problem.transfer_cost(s, d, n) * w + c_problem.transfer_cost(s, d, n))
        sol = solve(combined)
        if sol.placement and math.isfinite(sol.cost):
            key = tuple(sol.placement[l] for l in inp.layers)
            found.setdefault(key, evaluate(inp, "frontier", sol.placement, billing))
    points = [e for e in found.values() if e.usd_per_batch is not None]
    return sorted([e for e in points if not any(
        o.seconds_per_batch <= e.seconds_per_batch and o.usd_per_batch <= e.usd_per_batch
        and (o.seconds_per_batch < e.seconds_per_batch or o.usd_per_batch < e.usd_per_batch) for o in points)],
        key=lambda e: e.seconds_per_batch)
