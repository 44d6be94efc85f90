"""tbs's own GPU measurements (profiles/h200/, issue 29) against each other and against tbs's GPU predictions.

    python benchmarks/gpu_measured.py        # a minute: reads the committed profiles, measures nothing

1. Sum of the layers / the whole on the measured GPU and its host CPU: the compiled model (inference) or
   the compiled train step (training), per model, batch and device, from each profile as measured.
2. ``tbs predict`` from this machine's CPU profile of each model (profiles/cpu/<model>/inference) against
   the GPU's measured rows: per layer and whole model, the median and p90 of |log(predicted / measured)|
   (shown as a factor - 1) and how many measured times fall inside the prediction's 90% band.
3. ``tbs recommend --verify`` as the GPU machine ran it: each placement predicted against measured.

Writes benchmarks/gpu_measured.md and benchmarks/rows/gpu_measured.csv (one row per compared cell).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from common import ROOT, markdown

import tbs  # noqa: E402
from tbs.predictions.reference.measured import loop_seconds  # noqa: E402

MEASURED = ("ok", "noisy")
# How each GPU cell was timed (tbs.predictions.reference.measured): with the harness loop kept and at least one
# iteration long; before the harness fix (the loop XLA deleted: ~22 us of it left in each cell); or shorter than
# one iteration of its own loop, whose subtracted cost overlaps the kernel (not resolved).
TIMINGS = ("resolved", "before the harness fix", "under one loop iteration")
WHOLE = "(model)"


@functools.cache
def _profile(folder: Path) -> tbs.Profile:
    """Each profile read once (every table reads the same folders); nothing here changes one."""
    return tbs.load(folder)


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"].isin(MEASURED) & frame["median_s"].notna()]


def stale(device: str, loop_s: float) -> bool:
    """A GPU cell timed before the harness fix. A CPU's loop iteration reads 0 s by itself (nanoseconds, under the
    noise of the single-call and block timings the harness subtracts), so its rows never carry that flag."""
    return device.startswith("gpu") and not loop_s > 0


def sum_against_whole(profile_dir: Path) -> list[dict]:
    """Per (device, batch): the whole program's median, the sum of its layers' medians, and how many were measured."""
    p = _profile(profile_dir.resolve())
    layers = p.summary
    out = []
    for _, whole in _measured(p.model).iterrows():
        cells = loop_seconds(p.samples, str(whole["device"]))
        loop = min((v for (_, b), v in cells.items() if b == int(whole["batch_size"])), default=0.0)
        mine = layers[(layers["device"] == whole["device"]) & (layers["batch_size"] == whole["batch_size"])]
        done = _measured(mine)
        total_s = float(done["median_s"].sum())
        out.append(dict(model=profile_dir.parent.name, mode=profile_dir.name, device=whole["device"],
                        batch=int(whole["batch_size"]), whole_ms=1e3 * float(whole["median_s"]),
                        layers_ms=1e3 * total_s, measured=f"{len(done)} of {len(mine)}",
                        ratio=total_s / float(whole["median_s"]) if len(done) == len(mine) else np.nan,
                        timed=TIMINGS[1] if stale(str(whole["device"]), loop) else ""))
    return out


def compared_cells(cpu_dir: Path, gpu_dir: Path, catalog_id: str) -> pd.DataFrame:
    """Each GPU cell the H200 measured beside the prediction ``tbs predict`` makes for it from the CPU profile."""
    predicted = tbs.predict(cpu_dir, [catalog_id]).predictions
    gpu = _profile(gpu_dir.resolve())
    columns = ["layer", "device", "batch_size", "category", "median_s", "shared_with"]
    measured = pd.concat([_measured(gpu.summary).reindex(columns=columns),
                          _measured(gpu.model).assign(layer=WHOLE, category="whole model").reindex(columns=columns)])
    measured = measured[(measured["device"] == "gpu:0") & measured["batch_size"].isin(predicted["batch_size"])]
    merged = measured.merge(predicted[["layer", "batch_size", "median_s", "low_s", "high_s", "method"]],
                            on=["layer", "batch_size"], suffixes=("_measured", "_predicted"))
    merged = merged[(merged["median_s_measured"] > 0) & (merged["median_s_predicted"] > 0)]
    merged.insert(0, "model", gpu_dir.parent.name)
    merged["log_error"] = np.log(merged["median_s_predicted"] / merged["median_s_measured"])
    merged["inside"] = merged["median_s_measured"].between(merged["low_s"], merged["high_s"])
    per_cell = loop_seconds(gpu.samples, "gpu:0")  # the whole model's samples name it WHOLE too
    owner = merged["shared_with"].where(merged["shared_with"].notna() & (merged["shared_with"] != ""), merged["layer"])
    loop = pd.Series([per_cell.get((str(layer), int(batch)), 0.0)  # a shared cell's samples are its owner's
                      for layer, batch in zip(owner, merged["batch_size"])], index=merged.index)
    merged["timing"] = np.select([loop <= 0, merged["median_s_measured"] < loop], TIMINGS[1:], TIMINGS[0])
    return merged.reset_index(drop=True)


def error_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 error, inside-band share and the typical ratio, per model and for layers vs whole models."""
    def row(group: pd.DataFrame) -> dict:
        error = group["log_error"].abs()
        return {"cells": len(group), "median error": f"{np.expm1(error.median()):.0%}",
                "p90 error": f"{np.expm1(error.quantile(0.9)):.0%}",
                "median predicted / measured": f"{np.exp(group['log_error'].median()):.2f}",
                "inside the 90% band": f"{group['inside'].mean():.0%}"}

    cells = cells.assign(what=np.where(cells["layer"] == WHOLE, "whole model", "layers"))
    rows = [dict(model=m, what=w, **row(g)) for (m, w), g in cells.groupby(["model", "what"], sort=True)]
    rows += [dict(model="all", what=w, **row(g)) for w, g in cells.groupby("what", sort=True)]
    rows += [dict(model=f"all: {t}", what=w, **row(g)) for (t, w), g in cells.groupby(["timing", "what"], sort=False)]
    return pd.DataFrame(rows)


def verify_table(verify_json: Path) -> pd.DataFrame:
    verified = json.loads(verify_json.read_text())
    result = verified["verification"]["results"]
    table = pd.DataFrame([{"placement": r["placement"],
                          "predicted µs/sample": f"{1e6 * r['predicted_seconds_per_sample']:.1f}",
                          "measured µs/sample": f"{1e6 * r['measured_seconds_per_sample']:.1f}",
                          "95% CI": f"{1e6 * r['ci_low_seconds_per_sample']:.0f}-{1e6 * r['ci_high_seconds_per_sample']:.0f}",
                          "predicted / measured": f"{r['predicted_seconds_per_sample'] / r['measured_seconds_per_sample']:.2f}"}
                         for r in result])
    table.attrs["objective"] = verified.get("objective", "time")  # what the placement minimised: the title's
    return table


def seed_claims(gpu_profiles: Path) -> pd.DataFrame:
    """The TBS paper's three GPU claims, on the H200 machine's measured rows (its host CPU beside the GPU)."""
    rows = []
    for model, layers, claim in (("cnn_flowers", ("conv2d", "conv2d_1"), "conv faster on the GPU"),
                                 ("cnn_flowers", ("rescaling",), "preprocessing cheaper on the CPU"),
                                 ("rnn_mnist", ("simple_rnn",), "RNN faster on the GPU only at large batches")):
        folder = gpu_profiles / model / "inference"
        if not (folder / "summary.csv").is_file():
            continue
        cells = _measured(_profile(folder.resolve()).summary)
        for (layer, batch), group in cells[cells["layer"].isin(layers)].groupby(["layer", "batch_size"]):
            by = group.set_index("device")
            if not {"cpu:0", "gpu:0"} <= set(by.index):
                continue
            cpu, gpu = by.loc["cpu:0"], by.loc["gpu:0"]
            rows.append({"claim": claim, "layer": f"{model}/{layer}", "batch": int(batch),
                         "cpu µs/sample": f"{1e6 * cpu['per_sample_s']:.3g}", "gpu µs/sample": f"{1e6 * gpu['per_sample_s']:.3g}",
                         "cpu $/1M": f"{1e6 * cpu['cost_per_sample_usd']:.3g}", "gpu $/1M": f"{1e6 * gpu['cost_per_sample_usd']:.3g}",
                         "faster": "gpu" if gpu["per_sample_s"] < cpu["per_sample_s"] else "cpu",
                         "cheaper": "gpu" if gpu["cost_per_sample_usd"] < cpu["cost_per_sample_usd"] else "cpu"})
    return pd.DataFrame(rows)


def _without(profile: tbs.Profile, device: str) -> tbs.Profile:
    """The profile as if ``device`` had not been measured (its rows, metadata and copies left out)."""
    def keep(frame: pd.DataFrame) -> pd.DataFrame:
        if not len(frame):
            return frame
        mask = pd.Series(True, index=frame.index)
        for column in ("device", "src", "dst"):  # rows, and copies to or from it
            if column in frame:
                mask &= frame[column].astype(str) != device
        return frame[mask]

    metadata = dict(profile.metadata, devices=[d for d in profile.metadata["devices"] if d["name"] != device])
    return dataclasses.replace(profile, metadata=metadata, **{name: keep(getattr(profile, name)) for name in
                                                              ("summary", "model", "samples", "analysis", "transfers")})


def placements(gpu_profiles: Path, catalog_id: str) -> pd.DataFrame:
    """``tbs recommend`` on the H200 machine's measured CPU and GPU, against the same with the GPU predicted
    (``tbs predict`` from that host CPU's rows, --include-predicted): does the placement change?"""
    rows = []
    for folder in sorted(gpu_profiles.glob("*/inference")):
        measured = _profile(folder.resolve())
        if not {"cpu:0", "gpu:0"} <= set(_measured(measured.summary)["device"]):  # BERT: no GPU cell yet
            continue
        usd_per_hour = measured.metadata["prices_usd_per_hour"]
        predicted = tbs.predict(_without(measured, "gpu:0"), [catalog_id], source="cpu:0",
                                prices={catalog_id: usd_per_hour.get("gpu:0") or usd_per_hour.get("gpu")})
        for batch in measured.meta.batch_sizes:
            for objective in ("time", "cost"):
                real = tbs.recommend(measured, objective, batch_size=batch)
                try:
                    guess = tbs.recommend(predicted, objective, batch_size=batch, include_predicted=True)
                except tbs.TbsError as exc:  # a layer the host CPU failed (its LSTMs, the first run) has no prediction
                    rows.append({"model": folder.parent.name, "batch": batch, "objective": objective,
                                 "same placement": f"not predictable: {str(exc).split(':')[0]}"})
                    continue
                on_gpu = [layer for layer, d in real.chosen.placement.items() if d == "gpu:0"]
                guessed = [layer for layer, d in guess.chosen.placement.items() if d == catalog_id]
                rows.append({"model": folder.parent.name, "batch": batch, "objective": objective,
                             "layers on the GPU, measured": str(len(on_gpu)), "predicted": str(len(guessed)),
                             "same placement": "yes" if set(on_gpu) == set(guessed) else "no",
                             "µs/sample, measured rows": f"{1e6 * real.chosen.seconds_per_batch / batch:.3g}",
                             "µs/sample, predicted rows": f"{1e6 * guess.chosen.seconds_per_batch / batch:.3g}"})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-profiles", type=Path, default=ROOT / "profiles" / "h200")
    parser.add_argument("--cpu-profiles", type=Path, default=ROOT / "profiles" / "cpu")
    parser.add_argument("--catalog-device", default="h200", help="the catalog id the GPU is predicted as")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_measured.md")
    args = parser.parse_args()
    sums = [r for d in sorted(args.gpu_profiles.glob("*/*/")) if (d / "model.csv").is_file()
            for r in sum_against_whole(d)]
    cells = pd.concat([compared_cells(cpu, args.gpu_profiles / cpu.parent.name / "inference", args.catalog_device)
                       for cpu in sorted(args.cpu_profiles.glob("*/inference"))
                       if (args.gpu_profiles / cpu.parent.name / "inference" / "model.csv").is_file()],
                      ignore_index=True)
    cells.to_csv(ROOT / "benchmarks" / "rows" / "gpu_measured.csv", index=False)
    text = render(pd.DataFrame(sums), error_table(cells), cells,
                  verify_table(args.gpu_profiles / "cnn_flowers" / "verify.json"), args)
    text += "\n".join([
        "## The seed's claims, measured (the H200 machine's host CPU and GPU, the catalog's prices)", "",
        markdown(seed_claims(args.gpu_profiles)), "",
        "## `tbs recommend` with the GPU measured, and with it predicted from the same host CPU", "",
        "The measured profile's devices (its host CPU and the GPU), against the same profile with the GPU's rows "
        f"left out and `{args.catalog_device}` predicted from "
        "the host CPU's rows (`--include-predicted`), at the same prices. The times are each placement's own "
        "(measured rows against predicted rows). A predicted GPU's host copies are assumed as tbs timed them on "
        "this same H200 machine (`tbs/place/predicted.py`: the median over its profiles), so the copies agree by "
        "construction and a placement that differs differs by its layers' predictions.", "",
        markdown(placements(args.gpu_profiles, args.catalog_device).fillna("")), ""])
    args.out.write_text(text)
    print(args.out.read_text())


def _shown(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def render(sums: pd.DataFrame, errors: pd.DataFrame, cells: pd.DataFrame, verify: pd.DataFrame,
           args: argparse.Namespace) -> str:
    sums = sums.assign(whole_ms=sums["whole_ms"].map("{:.3g}".format), layers_ms=sums["layers_ms"].map("{:.3g}".format),
                       ratio=sums["ratio"].map(lambda r: "" if np.isnan(r) else f"{r:.2f}"))
    resolved = cells[cells["timing"] == TIMINGS[0]]
    worst = resolved.reindex(resolved["log_error"].abs().sort_values(ascending=False).index).head(12)
    worst = worst.assign(measured_us=(1e6 * worst["median_s_measured"]).map("{:.3g}".format),
                         predicted_us=(1e6 * worst["median_s_predicted"]).map("{:.3g}".format),
                         ratio=np.exp(worst["log_error"]).map("{:.2f}".format))
    sums = sums.rename(columns={"whole_ms": "whole ms/call", "layers_ms": "Σ layers ms/call", "ratio": "Σ / whole"})
    worst = worst[["model", "layer", "category", "batch_size", "measured_us", "predicted_us", "ratio", "inside"]].rename(
        columns={"measured_us": "measured µs/call", "predicted_us": "predicted µs/call", "ratio": "predicted / measured"})
    gpu, cpu = _shown(args.gpu_profiles), _shown(args.cpu_profiles)
    return "\n".join([
        "# tbs's own GPU measurements (issue 29)", "",
        f"`python benchmarks/gpu_measured.py`: the profiles in `{gpu}/`, measured by `benchmarks/gpu/run.sh` on one "
        f"NVIDIA H200 (`{gpu}/runs/` holds each run's log and environment), and this machine's CPU profiles in "
        f"`{cpu}/`. Nothing here is re-measured.", "",
        "## Sum of the layers against the whole compiled program", "",
        "Each layer is timed alone as a compiled loop; the whole model (inference) or train step (training) is "
        "timed the same way. A ratio is given only where every layer was measured (a cut run leaves some out). "
        "`before the harness fix`: runs 1 and 2, whose timing loop read 0 s an iteration, so each GPU layer cell "
        "kept ~22 µs of it (a CPU's loop costs nanoseconds).", "",
        markdown(sums), "",
        f"## `tbs predict` from a CPU profile against the measured GPU (as catalog device `{args.catalog_device}`)", "",
        "Errors are |log(predicted / measured)| shown as a factor - 1; the band is the prediction's 90% band. "
        "Layers measured at 0 (inactive in inference) are left out. The `all: ...` rows split the cells by how they "
        "were timed: `resolved` (the harness loop kept, the cell at least one loop iteration long: ~22 µs on the "
        "H200), `before the harness fix` (runs 1 and 2: ~22 µs of loop left in each cell) and `under one loop "
        "iteration` (the loop's subtracted cost overlaps the kernel: not resolved). Only the first says how good "
        "the prediction is.", "",
        markdown(errors), "", "The resolved cells furthest off:", "", markdown(worst), "",
        f"## `tbs recommend --verify` on the GPU machine (cnn_flowers, batch 32, objective {verify.attrs['objective']})",
        "",
        markdown(verify), ""])

if __name__ == "__main__":
    main()
