"""The profile's CSV files: each file's columns, what every column may hold, and the columns a row needs.

Part of the profile format (``tbs.schema``, whose history says which version added which column).
A profile read from disk is checked against ``COLUMN_KINDS``, ``COLUMN_VALUES`` and
``REQUIRED_COLUMNS`` (tbs.profiles.csvfiles).
"""

from __future__ import annotations

from tbs.schema import Phase, Status

# A training row's phases: seconds per call at its batch size; 0.0 where the layer has no such
# phase (nothing to differentiate or update), blank where the phase failed.
PHASE_COLUMNS = ["forward_s", "backward_s", "update_s"]
TRAINING_MEMORY_COLUMNS = ["weight_bytes", "slot_bytes", "residual_bytes"]  # weight_bytes: inference rows too

# The compiler's analysis of a cell's programs (totals over its phases) and what it implies
# against the device's calibrated ceilings (tbs.profiles.roofline).
COST_COLUMNS = ["flops", "bytes_accessed", "flops_unoptimized", "bytes_unoptimized", "transcendentals",
                "temp_bytes", "cost_source"]
ROOFLINE_COLUMNS = ["arithmetic_intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "roofline_s",
                    "fraction_of_roofline", "bound"]
ANALYSIS_COLUMNS = [
    "target", "layer", "device", "batch_size", "mode", "phase", "flops", "bytes_accessed", "flops_unoptimized",
    "bytes_unoptimized", "transcendentals", "temp_bytes", "argument_bytes", "output_bytes", "cost_source", "reason",
    "kernels",
]
# A cell tbs did not measure: a device from the catalog, its time scaled from a measured one.
PREDICTION_COLUMNS = [
    "target", "layer", "layer_type", "category", "device", "device_kind", "batch_size", "mode", "source",
    "method", "predicted_from", "median_s", "low_s", "high_s", "per_sample_s", "usd_per_hour",
    "cost_per_sample_usd", "price_source", "flops", "bytes_accessed", "bound", "reason", "in_model_s", "model_share",
]
PREDICTED = "predicted"  # predictions.csv's ``source``; measured rows never carry it

SUMMARY_COLUMNS = [
    "layer", "layer_type", "category", "device", "device_kind", "batch_size", "mode", "status",
    "reason", "n", "iterations", "median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s",
    "per_sample_s", "usd_per_hour", "cost_per_sample_usd", "first_call_s", "host",
    "phases", *PHASE_COLUMNS, *TRAINING_MEMORY_COLUMNS, "grad_inputs", "in_step", "shared_with", "activation_bytes",
    *COST_COLUMNS, *ROOFLINE_COLUMNS, "in_model_s", "model_share", "in_model_shared_s", "in_model_note",
]
MODEL_COLUMNS = [
    "device", "device_kind", "batch_size", "mode", "status", "reason", "n", "iterations",
    "median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s", "per_sample_s", "layers_sum_s",
    "layers_sum_per_sample_s", "layers_measured", "overlapped_s", "dispatch_overhead_s", "input_copy_s",
    "input_bytes", "first_call_s", "usd_per_hour", "cost_per_sample_usd", "host", *COST_COLUMNS,
    "argument_bytes", "output_bytes", "memory_bytes", "peak_bytes", *ROOFLINE_COLUMNS,
    "in_model_s", "model_share", "unowned_s", "traced_calls",
]
# A few whole-model calls per (device, batch) traced with the framework's profiler (kind "call": a call's span,
# first op to last; kind "op": one op, ``parts`` = JSON [[framework op path, work], ...], what it runs).
OPS_COLUMNS = ["device", "batch_size", "mode", "kind", "call", "name", "start_s", "duration_s", "parts", "tool"]
TRANSFER_COLUMNS = ["src", "dst", "bytes", "sample", "seconds"]
SAMPLE_COLUMNS = [
    "target", "layer", "device", "batch_size", "mode", "sample", "iterations", "raw_seconds",
    "harness_call_s", "harness_iteration_s", "seconds_per_call", "host", "phase",
]

# What every column may hold. A profile read from disk is checked against this (tbs.profiles.csvfiles):
# a value of the wrong kind, an impossible time or an unknown status is a damaged row, refused with its
# file and line, never drawn or summed. A column name means the same in every file.
# count: a whole number >= 0; amount: a number >= 0; flag: True or False (blank where it does not apply)
TEXT, COUNT, SECONDS, AMOUNT, FLAG = "text", "count", "seconds", "amount", "flag"
_SECONDS = ["median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s", "per_sample_s", "first_call_s", *PHASE_COLUMNS,
            "layers_sum_s", "layers_sum_per_sample_s", "overlapped_s", "dispatch_overhead_s", "input_copy_s",
            "raw_seconds",
            "harness_call_s", "harness_iteration_s", "seconds_per_call", "seconds", "low_s", "high_s", "roofline_s", "in_model_s",
            "in_model_shared_s", "unowned_s", "start_s", "duration_s"]
_COUNTS = ["batch_size", "n", "iterations", "sample", "layers_measured", "traced_calls", "call"]
_AMOUNTS = ["usd_per_hour", "cost_per_sample_usd", *TRAINING_MEMORY_COLUMNS, "activation_bytes", "input_bytes",
            "bytes", *[c for c in COST_COLUMNS if c != "cost_source"], "argument_bytes", "output_bytes",
            "memory_bytes", "peak_bytes", *[c for c in ROOFLINE_COLUMNS if c not in ("bound", "roofline_s")],
            "model_share"]
COLUMN_KINDS: dict[str, str] = {**{c: SECONDS for c in _SECONDS}, **{c: COUNT for c in _COUNTS},
                                **{c: AMOUNT for c in _AMOUNTS}, "in_step": FLAG}
# Columns whose text must be one of a few words.
COLUMN_VALUES: dict[str, tuple[str, ...]] = {
    "status": tuple(s.value for s in Status), "mode": ("inference", "training"), "target": ("layer", "model"),
    "phase": tuple(p.value for p in Phase), "bound": ("compute", "memory", "overhead"), "source": (PREDICTED,),
    "kind": ("call", "op"),
}
# Per file, the columns a row cannot do without (what names its cell).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "summary": ("layer", "device", "batch_size", "mode", "status"),
    "model": ("device", "batch_size", "mode", "status"),
    "samples": ("target", "layer", "device", "batch_size", "mode", "iterations", "raw_seconds"),
    "transfers": ("src", "dst", "bytes", "seconds"),
    "analysis": ("target", "layer", "device", "batch_size", "mode"),
    "predictions": ("layer", "device", "batch_size", "mode", "source"),
    "ops": ("device", "batch_size", "mode", "kind", "call", "start_s", "duration_s"),
}
