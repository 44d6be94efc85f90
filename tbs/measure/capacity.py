"""The largest batch that fits on each device: fitted from compiled memory, confirmed by a real call.

Memory is close to affine in the batch size: weights and fixed buffers, plus activations per
sample. Each measured batch size gives a point -- the compiled whole model's memory (XLA's
arguments + outputs + temporaries) in inference, the weights, optimizer slots, gradients and
saved residuals in training -- plus the inputs held on the host. A line through them, against
the device's memory (the host's headroom, which a data-size limit lowers), is the compiler's
estimate. The answer itself comes from real calls, each at most 2x a batch whose peak memory
was measured, up to the batch that measured peak allows: a framework that keeps more alive
than the compiled program (TensorFlow's graphs do) cannot mislead it into a call the OS kills.
A call that fails is recorded with its reason, never raised.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd

from tbs.backends.base import Device
from tbs.measure import rows
from tbs.schema import MEASURED

SEARCH_LIMIT = 2**20  # batches beyond this are not searched (no user needs the exact figure)
CONFIRM_SECONDS = 30.0  # a confirming call predicted to take longer is skipped, and says so
HOST_MARGIN = 0.9  # use 90% of the host's headroom: the OS kills a process that takes all of it
GROWTH = 2  # each real call is at most this multiple of one whose peak was measured
STEP_MARGIN = 0.8  # ... and its extrapolated peak stays under 80% of the budget


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(bytes at batch 0, bytes per sample) through (batch, bytes) points; None without two batch sizes."""
    batches = {b for b, _ in points}
    if len(batches) < 2:
        return None
    slope, intercept = np.polyfit([float(b) for b, _ in points], [float(v) for _, v in points], 1)
    return float(intercept), float(slope)


def largest_batch(line: tuple[float, float], limit_bytes: float) -> int | None:
    """The largest batch whose fitted memory stays within ``limit_bytes`` (None: not even batch 1)."""
    intercept, slope = line
    if intercept > limit_bytes:
        return None
    if slope <= 0:
        return SEARCH_LIMIT
    batch = math.floor((limit_bytes - intercept) / slope)
    return min(batch, SEARCH_LIMIT) if batch >= 1 else None


def inference_points(model_rows: pd.DataFrame) -> list[tuple[int, float]]:
    """(batch, bytes) from a device's model rows: compiled memory plus the inputs on the host."""
    out = []
    for _, row in model_rows.iterrows():
        memory = pd.to_numeric(pd.Series([row.get("memory_bytes")]), errors="coerce").iloc[0]
        if pd.notna(memory):
            out.append((int(row["batch_size"]), float(memory) + float(row.get("input_bytes") or 0)))
    return out


def training_points(layer_rows: pd.DataFrame) -> list[tuple[int, float]]:
    """(batch, bytes) from a device's training rows: weights, their gradients and slots, and residuals."""
    out: list[tuple[int, float]] = []
    columns = ["weight_bytes", "slot_bytes", "residual_bytes"]
    if layer_rows.empty or not set(columns) <= set(layer_rows.columns):
        return out
    for batch, group in layer_rows.groupby("batch_size"):
        measured = group[group["status"].isin(MEASURED)] if "status" in group else group
        parts = measured[columns].apply(pd.to_numeric, errors="coerce")
        if parts.empty or len(measured) < len(group) or parts.isna().any().any():
            continue  # a failed layer or a size the program does not say: no point, rather than a low one
        total = 2 * parts["weight_bytes"].sum() + parts["slot_bytes"].sum() + parts["residual_bytes"].sum()
        out.append((int(batch), float(total)))
    return out


def _attempt(run_at: Callable[[int], None], device: Device, batch: int, base: int | None) -> dict[str, Any]:
    """One real call at ``batch``: did it run, and how far above ``base`` (before the search) memory peaked.

    Measured from one baseline for every call, so memory an earlier call left resident
    (allocators keep what they freed) counts against the next, never hides its growth.
    """
    device.peak_memory_bytes(reset=True)
    try:
        run_at(batch)
    except Exception as exc:  # out of memory (or worse) is recorded, never raised
        return {"batch_size": batch, "ok": False, "oom": rows.is_oom(exc), "reason": rows.reason(exc)}
    peak = device.peak_memory_bytes()
    growth = None if base is None or peak is None else max(peak - base, 0)
    return {"batch_size": batch, "ok": True, "peak_bytes": growth}


def search(run_at: Callable[[int], None], device: Device, start: int, budget_bytes: float,
           seconds_per_sample: float | None, ceiling: int) -> dict[str, Any]:
    """Real calls at growing batches (x2 while the measured peak allows), then one at the extrapolated limit.

    Each step is at most 2x a batch whose peak was measured, so no call is sized by an estimate
    alone (the OS kills a process that outgrows the host). A failing call ends the search: the
    largest batch that ran is the answer, and the failure is kept with its reason.
    """
    tried: list[dict[str, Any]] = []
    batch, best, reason = max(start, 1), None, ""
    base = device.peak_memory_bytes(reset=True)
    while True:
        if seconds_per_sample and seconds_per_sample * batch > CONFIRM_SECONDS:
            reason = f"not searched beyond: a call at batch {batch} would take about {seconds_per_sample * batch:.0f} s"
            break
        attempt = _attempt(run_at, device, batch, base)
        tried.append(attempt)
        if not attempt["ok"]:
            reason = f"batch {batch} failed: {attempt['reason']}"
            break
        best = batch
        if attempt.get("peak_bytes") is None:  # blind to memory: growing would risk the whole run
            reason = f"not searched beyond batch {batch}: {device.name} exposes no peak-memory counter here"
            break
        per_sample = attempt["peak_bytes"] / batch
        allowed = ceiling if per_sample <= 0 else min(ceiling, math.floor(STEP_MARGIN * budget_bytes / per_sample))
        if allowed <= batch:
            break
        batch = GROWTH * batch if allowed >= GROWTH * batch else allowed  # the last step: the extrapolated limit
    return {"confirmed_batch": best, "tries": tried, "reason": reason}


def device_capacity(device: Device, points: list[tuple[int, float]], limit_bytes: float | None,
                    run_at: Callable[[int], None] | None, seconds_per_sample: float | None,
                    measured_batch: int = 1) -> dict[str, Any]:
    """The compiler's memory line, the batch it allows within ``limit_bytes``, and the real calls that check it.

    Without ``run_at`` (no search asked for) the answer is the compiler's estimate alone, and says so.
    """
    out: dict[str, Any] = {"points": [{"batch_size": b, "bytes": v} for b, v in points], "limit_bytes": limit_bytes}
    line = fit_line(points)
    if line is not None:
        out.update(intercept_bytes=line[0], bytes_per_sample=line[1])
    if not limit_bytes:
        return dict(out, largest_batch=None, reason=f"{device.name} does not say how much memory it has")
    budget = limit_bytes * (HOST_MARGIN if device.kind == "cpu" else 1.0)
    out["estimated_batch"] = largest_batch(line, budget) if line is not None else None
    out["estimate_capped"] = out["estimated_batch"] == SEARCH_LIMIT  # "this many or more"
    if run_at is None:
        return dict(out, largest_batch=None, tries=[], reason="not searched: the compiler's estimate only "
                    "(tbs profile --capacity confirms it by real calls)")
    start = measured_batch  # the largest batch already measured and timed (never one that failed)
    found = search(run_at, device, start, budget, seconds_per_sample, SEARCH_LIMIT)
    return dict(out, largest_batch=found["confirmed_batch"], capped=found["confirmed_batch"] == SEARCH_LIMIT, **found)


def call_at(request: Any, device: Device) -> Callable[[int], None]:
    """One real call of the whole model (a train step when training) at a batch size, on ``device``.

    Compiled like the timed programs and run once; everything it allocated is dropped after.
    """
    from tbs.load.inputs import structure_inputs

    model = request.model_on(device)

    def run(batch: int) -> None:
        inputs = device.place(structure_inputs(model, request.host_inputs(batch), request.specs))
        tensors = request.tensors_fn(inputs)
        if request.training_setup is None:
            def forward(*flat: Any) -> Any:
                return model(request.rebuild_fn(inputs, list(flat)), training=False)

            runner = device.compile_blocked(forward, tensors, request.xla, model.variables, outputs_written=True)
        else:
            setup = request.training_setup
            small = model(structure_inputs(model, request.host_inputs(1), request.specs), training=False)
            shaped = [np.zeros((batch,) + tuple(np.shape(o))[1:], np.asarray(o).dtype)
                      for o in request.tensors_fn(small)]
            targets = device.place(setup.targets(shaped, batch, request.seed))
            runner = device.train_step(model, tensors, lambda flat: request.rebuild_fn(inputs, flat), list(targets),
                                       setup.loss, setup.make_optimizer, request.xla)
        try:
            runner(1)
        finally:
            if hasattr(runner, "restore"):
                runner.restore()  # a train step changed the weights: put them back

    return run


def all_capacities(request: Any, saved: list[tuple[Any, dict[str, Any]]], limit_for: Callable[[Device], float | None],
                   describe: Callable[[str], None]) -> dict[str, Any]:
    """Every device's capacity from the rows saved in this run (``saved``: (cell key, row) pairs)."""
    out = {}
    for device in request.devices:
        mine = [(k, r) for k, r in saved if k.device == device.name]
        model = pd.DataFrame([r for k, r in mine if k.target == "model"])
        if request.training:
            points = training_points(pd.DataFrame([r for k, r in mine if k.target == "layer"]))
        else:
            points = inference_points(model) if len(model) else []
        if not points and not request.capacity:
            continue  # no compiled memory figure and no search asked for: nothing to say about this device
        per_sample = pd.to_numeric(model.get("per_sample_s", pd.Series(dtype=float)), errors="coerce").max()
        if request.capacity:
            describe(f"finding the largest batch that fits on {device.name} (real calls, doubling)")
        try:
            out[device.name] = device_capacity(device, points, limit_for(device),
                                               call_at(request, device) if request.capacity else None,
                                               None if pd.isna(per_sample) else float(per_sample),
                                               max([int(k.batch_size) for k, r in mine
                                                    if r.get("status") in MEASURED], default=1))
        except Exception as exc:  # the measuring is done: a capacity that cannot be found is a reason, not a crash
            out[device.name] = {"largest_batch": None, "tries": [], "reason": rows.reason(exc)}
            continue
        note = device.memory_estimate_note(request.xla)
        if note and not request.capacity:
            out[device.name]["note"] = note
    return out


def measured_peak(device: Device, runner: Callable[[int], None]) -> int | None:
    """The memory one call of a compiled whole-model program peaks at above what was in use before it.

    Called once the program has been timed (compiled and warm).
    """
    base = device.peak_memory_bytes(reset=True)
    runner(1)
    peak = device.peak_memory_bytes()
    return None if base is None or peak is None else max(int(peak - base), 0)
