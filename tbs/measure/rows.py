"""Rows of a profile's files, built from measurements (one row per cell, one per sample)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tbs.capture.recorder import LayerCall
from tbs.schema import Phase, Status
from tbs.backends.base import Device, ProgramCost
from tbs.backends.tensors import tensor_bytes
from tbs.measure.timing import Measurement, Runner

SINGLE_CALLS = 5  # single calls timed after a whole model's samples: its per-call dispatch overhead
NOISY_REASON = "CI of the median stayed wider than the target within the cell budget"


@dataclass
class Cell:
    """A cell waiting to be measured: its programs, compiled at warm-up, and how their measurements become its row.

    An inference cell has one program (the forward pass); a training cell one per phase.
    """

    label: str  # what the progress line says
    base: dict[str, Any]  # the row's identity columns
    data: Any  # the tensors it reads and writes (a device may refuse them)
    programs: Callable[[], dict[str, Runner]]  # phase -> compiled runner
    build: Callable[[dict[str, Measurement]], dict[str, Any]]  # phase -> measurement, to the row
    target: str = "layer"  # samples.csv's target: "layer" | "model"
    single_calls: int = 0  # single (unblocked) calls timed after sampling: the dispatch overhead
    # Grow its iterations until its own fixed per-call cost is amortised (a whole train step: see timing.py).
    amortise_fixed: bool = False
    # The compiler's analysis of the cell's programs (phase -> ProgramCost), asked once they compile.
    analyse: Callable[[], dict[str, ProgramCost]] | None = None
    call: LayerCall | None = None  # the layer call (for the shape formulas where the compiler says nothing)
    # What fixes its programs (tbs.measure.dedupe): cells that share one are measured once. None: alone.
    signature: tuple | None = None
    # Phases timed only where a sample of the first program holds several calls: calls back to
    # back (``overlapped``) have nothing to overlap when one call already fills a sample.
    several_calls_only: tuple[str, ...] = ()
    # Traced after its samples (never among them): ops.csv rows (the whole model's in-context calls), or None.
    trace: Callable[[], list[dict[str, Any]] | None] | None = None


def reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def is_oom(exc: BaseException) -> bool:
    """Out of memory on any backend: TensorFlow's ResourceExhaustedError, XLA's RESOURCE_EXHAUSTED."""
    text = str(exc)
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "ResourceExhaustedError"
            or "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower())


def fallback_ops(call: LayerCall, device: Device) -> list[str]:
    """Op types of this call that ran on the host CPU although the target is an accelerator."""
    if device.kind == "cpu":
        return []
    return sorted(
        op for op, devices in call.op_devices.items() if any("CPU" in d.upper() for d in devices if d)
    )


def stats_row(m: Measurement, base: dict[str, Any], confidence: float) -> dict[str, Any]:
    s = m.summary(confidence)
    per_sample = s.median_s / base["batch_size"]
    return dict(
        base, n=s.n, iterations=m.iterations, median_s=s.median_s, p25_s=s.p25_s,
        p75_s=s.p75_s, ci_low_s=s.ci_low_s, ci_high_s=s.ci_high_s, per_sample_s=per_sample,
        first_call_s=m.first_call_seconds,
    )


def sample_rows(target: str, layer: str, m: Measurement, base: dict[str, Any],
                phase: str = Phase.FORWARD.value) -> list[dict[str, Any]]:
    return [
        {"target": target, "layer": layer, "device": base["device"], "batch_size": base["batch_size"],
         "mode": base["mode"], "sample": i, "iterations": m.iterations, "raw_seconds": raw,
         "harness_call_s": m.overhead.per_call_seconds, "harness_iteration_s": m.overhead.per_iteration_seconds,
         "seconds_per_call": per_call, "host": base["host"], "phase": phase}
        for i, (raw, per_call) in enumerate(zip(m.raw_seconds, m.per_call_seconds))
    ]


def layer_row(call: LayerCall, device: Device, base: dict[str, Any], m: Measurement,
              confidence: float) -> dict[str, Any]:
    row = stats_row(m, base, confidence)
    row.update(status=m.status, reason=m.note or ("" if m.status == Status.OK else NOISY_REASON),
               **memory_columns(call))
    return flag_fallback(row, call, device)


def memory_columns(call: LayerCall) -> dict[str, int]:
    """What the layer holds: its variables, and its outputs at this batch size."""
    weights = sum(tensor_bytes(v.value) for v in getattr(call.op, "variables", ()) or ())
    return {"weight_bytes": int(weights), "activation_bytes": int(call.output_bytes)}


def flag_fallback(row: dict[str, Any], call: LayerCall, device: Device) -> dict[str, Any]:
    """A time from an accelerator whose ops partly ran on the host says so."""
    fallen = fallback_ops(call, device)
    if fallen:
        row.update(status=Status.CPU_FALLBACK.value, reason=f"ran on the host CPU: {', '.join(fallen)}")
    return row


def model_row(base: dict[str, Any], m: Measurement, copy_seconds: float, input_bytes: int,
              confidence: float) -> dict[str, Any]:
    row = stats_row(m, base, confidence)
    single = float(np.median(m.single_call_seconds)) if m.single_call_seconds else float("nan")
    row.update(status=m.status, reason=m.note or ("" if m.status == Status.OK else NOISY_REASON),
               dispatch_overhead_s=max(single - row["median_s"], 0.0),
               input_copy_s=copy_seconds, input_bytes=input_bytes)
    return row


def failed_row(base: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    return dict(base, status=(Status.OOM if is_oom(exc) else Status.ERROR).value, reason=reason(exc))
