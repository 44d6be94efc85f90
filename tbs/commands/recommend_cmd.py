"""`tbs recommend`: the placement that minimises cost (or time), against every single device."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
import pandas as pd

from tbs.commands.report_cmd import build
from tbs.recommend import Evaluation, Recommendation, recommend
from tbs.report.console import comparison_table
from tbs.units import format_seconds, format_usd


def _layer_rows(rec: Recommendation) -> list[dict[str, Any]]:
    inp, placement, batch = rec.inputs, rec.chosen.placement, rec.inputs.batch_size
    moved: set[tuple[int, str]] = set()
    rows = []
    for layer in inp.layers:
        device = placement[layer]
        seconds = inp.seconds[(layer, device)]
        price = inp.usd_per_hour.get(device)
        transfer = 0.0
        for ti, t in enumerate(inp.tensors):
            if layer not in t.consumers:
                continue
            src = inp.host if t.src.startswith("input") else placement[t.src]
            if src != device and (ti, device) not in moved:
                moved.add((ti, device))
                transfer += inp.transfer_seconds(src, device, t.bytes)
        rows.append({"layer": layer, "device": device, "seconds_per_sample": seconds / batch,
                     "usd_per_sample": None if price is None else seconds * price / 3600 / batch,
                     "transfer_in_seconds_per_sample": transfer / batch})
    return rows


def _saving(rec: Recommendation) -> dict[str, Any]:
    key = "usd_per_batch" if rec.objective == "cost" else "seconds_per_batch"
    singles = [e for e in rec.single_devices if getattr(e, key) is not None]
    if not singles:
        return {}
    best = min(singles, key=lambda e: getattr(e, key))
    ours, theirs = getattr(rec.chosen, key), getattr(best, key)
    out = {"best_single_device": best.name, "saving_fraction": (theirs - ours) / theirs if theirs else 0.0}
    if rec.chosen.usd_per_batch is not None and best.usd_per_batch is not None:
        out["saving_usd_per_1m_samples"] = (best.usd_per_batch - rec.chosen.usd_per_batch) / rec.inputs.batch_size * 1e6
    return out


def _eval_dict(e: Evaluation, batch: int) -> dict[str, Any]:
    return {"name": e.name, "placement": e.placement, **e.per_sample(batch)}


def as_json(rec: Recommendation) -> dict[str, Any]:
    batch = rec.inputs.batch_size
    return {
        "objective": rec.objective, "billing": rec.billing, "batch_size": batch, "method": rec.method,
        "layers": _layer_rows(rec),
        "recommended": _eval_dict(rec.chosen, batch),
        "single_devices": [_eval_dict(e, batch) for e in rec.single_devices],
        "per_layer_argmin": _eval_dict(rec.argmin, batch) if rec.argmin else None,
        "saving": _saving(rec),
        "frontier": [_eval_dict(e, batch) for e in rec.frontier],
        "inputs": rec.inputs.as_dict(),
    }


def as_text(rec: Recommendation) -> str:
    batch = rec.inputs.batch_size
    layers = pd.DataFrame(_layer_rows(rec))
    layers["time / sample"] = layers.pop("seconds_per_sample").map(format_seconds)
    layers["cost / sample"] = layers.pop("usd_per_sample").map(lambda v: format_usd(v) if v is not None and not
                                                               (isinstance(v, float) and math.isnan(v)) else "no price")
    layers["transfer in"] = layers.pop("transfer_in_seconds_per_sample").map(format_seconds)
    table = comparison_table(rec)
    saving = _saving(rec)
    lines = [f"Placement for batch {batch}: minimise {rec.objective} ({rec.billing} billing), {rec.method}; "
             "times predicted from the profile",
             layers.to_string(index=False), "", pd.DataFrame(table).to_string(index=False)]
    if saving:
        text = f"Saving against the best single device ({saving['best_single_device']}): {saving['saving_fraction']:.1%}"
        if "saving_usd_per_1m_samples" in saving:
            text += f", {format_usd(saving['saving_usd_per_1m_samples'])} per 1M samples"
        lines += ["", text]
    if rec.frontier:
        lines += ["", "Cost-latency frontier (per sample): " + "; ".join(
            f"{format_seconds(e.per_sample(batch)['seconds_per_sample'])} at "
            f"{format_usd(e.per_sample(batch)['usd_per_1m_samples'])}/1M" for e in rec.frontier)]
    return "\n".join(lines)


def run_recommend(directory: Path, prices: dict[str, float] | None, spot: dict[str, float] | None,
                  objective: str, batch_size: int | None, max_latency_ms: float | None,
                  budget: float | None, billing: str, fmt: str, verify: bool = False,
                  custom_files: tuple[Path, ...] = ()) -> None:
    profile = build((directory,), prices, spot, None)
    rec = recommend(profile, objective, batch_size, billing, max_latency_ms, budget)
    if fmt == "json":
        click.echo(json.dumps(as_json(rec), indent=2, default=str))
    else:
        click.echo(as_text(rec))
    if verify:
        click.echo(verify_recommendation(profile, rec, custom_files))


def verify_recommendation(profile: Any, rec: Recommendation, custom_files: tuple[Path, ...]) -> str:
    """Run the recommended placement and the single devices for real; report predicted vs measured."""
    from tbs.backend import choose

    meta = profile.metadata
    backend = str(meta.get("backend") or "tensorflow")
    choose(backend)  # the profile's backend, before Keras is imported
    from tbs.capture import capture
    from tbs.devices import discover
    from tbs.errors import TbsError
    from tbs.inputs import batch_arrays, input_specs, load_user_input, structure_inputs
    from tbs.model import import_custom_objects, load_model
    from tbs.timing import TimingConfig
    from tbs import verify

    if meta.get("merged_from"):
        raise TbsError("--verify runs one machine's profile; pass a single profile directory")
    model_path = Path(meta.get("model", {}).get("path", ""))
    if not model_path.is_file():
        raise TbsError(f"--verify needs the profiled model file '{model_path}' on this machine")
    found = {d.name: d for d in discover(backend).devices}
    needed = sorted(set(rec.chosen.placement.values()) | {rec.inputs.host} |
                    {d for e in rec.single_devices for d in e.placement.values()})
    absent = [d for d in needed if d not in found]
    if absent:
        raise TbsError(f"--verify: device(s) {', '.join(absent)} of the profile are not on this machine "
                       f"(found {', '.join(found)}); set TBS_LOGICAL_CPUS as when profiling")
    custom = import_custom_objects(list(custom_files))
    host = found[rec.inputs.host]
    batch, training = rec.inputs.batch_size, meta.get("mode") == "training"
    loaded = {d: load_model(model_path, custom, scope=found[d].scope).model for d in needed}
    specs = input_specs(loaded[host.name])
    source = str(meta.get("input_source", ""))
    user = None if source.startswith("synthetic") else load_user_input(Path(source), specs)
    arrays = batch_arrays(specs, batch, int(meta.get("seed", 0)), user)
    host_inputs = host.place(structure_inputs(loaded[host.name], arrays, specs))
    captures = {}
    for d in needed:
        with found[d].scope():
            captures[d] = capture(loaded[d], host_inputs if d == host.name else found[d].place(host_inputs),
                                  training, record_devices=backend == "tensorflow")
    by_name = {d: {c.name: c for c in cap.calls} for d, cap in captures.items()}
    placed_right = sum(found[d].ran_here(by_name[d][name]) for name, d in rec.chosen.placement.items())
    candidates = [("recommended", rec.chosen.placement, rec.chosen.seconds_per_batch)]
    candidates += [(e.name, e.placement, e.seconds_per_batch) for e in rec.single_devices]
    cfg = TimingConfig(**{k: v for k, v in (meta.get("timing") or {}).items() if k in TimingConfig.__dataclass_fields__})
    results = verify.run(candidates, captures, host_inputs, found, host, cfg)
    rows = []
    for r in results:
        rows.append({"placement": r.name, "predicted / sample": format_seconds(r.predicted_seconds_per_batch / batch),
                     "measured / sample": format_seconds(r.measured.median_s / batch),
                     "95% CI": f"{format_seconds(r.measured.ci_low_s / batch)} – {format_seconds(r.measured.ci_high_s / batch)}",
                     "error": f"{verify.relative_error(r.predicted_seconds_per_batch, r.measured.median_s):+.1%}",
                     "status": r.status})
    split = results[0]
    singles = results[1:]
    best = min(singles, key=lambda r: r.measured.median_s) if singles else split
    return "\n".join([
        "", f"Verified by running it (batch {batch}, from host inputs, interleaved rounds):",
        pd.DataFrame(rows).to_string(index=False),
        f"{placed_right} of {len(rec.chosen.placement)} layers ran their ops on the device they were placed on.",
        f"Verdict: {verify.verdict(split, best)} (best single device measured: {best.name}).",
    ])
