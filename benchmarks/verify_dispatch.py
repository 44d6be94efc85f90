"""`tbs recommend --verify`'s prediction with and without each program call's dispatch, against the measured replay.

A split placement runs, on JAX, as one compiled program per run of consecutive layers on one device (a jit
cannot span devices); each program call pays its device's dispatch (the whole model's single blocked call less
its looped call, measured with the profile). On TensorFlow the whole split is one graph: one call. This profiles
example models on JAX over two logical CPUs (``TBS_LOGICAL_CPUS=2``), then runs for real: the recommended
placement, each single device, and a placement that alternates devices layer by layer (a call per layer), and
prints each one's prediction without dispatch (the layers and copies alone), with it (what tbs prints now), and
the measured replay. A copy is priced at its timed time beyond the smallest timed copy's (tbs.measure.transfers:
every timed copy is waited for, ~160 µs on these logical CPUs, a wait a pass pays once, in its dispatch; a small
copy's own cost in a pass, ~60-80 µs here, is left out).

    TBS_LOGICAL_CPUS=2 python benchmarks/verify_dispatch.py --runs 3 --out benchmarks/verify_dispatch.md   # ~6 min
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from common import build_example, markdown

import tbs  # noqa: E402
from tbs import backends  # noqa: E402
from tbs.place.recommend import evaluate  # noqa: E402

MODELS = (("nn_twins", 32), ("rnn_mnist", 32), ("cnn_flowers", 32))


def alternating(layers: list[str], devices: list[str]) -> dict[str, str]:
    """Each layer on the next device in turn: as many program calls as layers."""
    return {layer: devices[i % len(devices)] for i, layer in enumerate(layers)}


def rows_for(name: str, batch: int, directory: Path) -> list[dict[str, object]]:
    """Profile ``name`` on JAX over two logical CPUs and verify three kinds of placement."""
    model = build_example(name, directory)
    profile = tbs.profile(model, [batch], devices=["cpu:0", "cpu:1"], backend="jax", out=directory / name,
                          progress=None, report=False)
    rec = tbs.recommend(profile, objective="time", batch_size=batch)
    alternate = evaluate(rec.data, "alternating", alternating(rec.data.layers, rec.data.devices), rec.billing)
    quiet = replace(rec.data, dispatch_seconds={})  # the same placements priced as before: layers and copies
    out = []
    for chosen in (rec.chosen, alternate):
        run = replace(rec, chosen=chosen, single_devices=rec.single_devices if chosen is rec.chosen else [])
        tbs.verify(profile, run)
        for label, result in zip([chosen.name] + [e.name for e in run.single_devices], run.verification.results):
            placement = result.placement
            calls = len(run.data.program_starts(placement))
            without = evaluate(quiet, result.name, placement, rec.billing).seconds_per_batch
            layers = sum(rec.data.seconds[(layer, device)] for layer, device in placement.items())
            measured = result.measured.median_s
            out.append({"model": name, "batch": batch, "placement": label, "program calls": calls,
                        "layers µs": round(layers * 1e6, 1), "copies µs": round((without - layers) * 1e6, 1),
                        "without dispatch µs": round(without * 1e6, 1),
                        "with dispatch µs": round(result.predicted_seconds_per_batch * 1e6, 1),
                        "measured µs": round(measured * 1e6, 1),
                        "95% CI µs": f"{result.measured.ci_low_s * 1e6:.0f}-{result.measured.ci_high_s * 1e6:.0f}",
                        "without / measured": round(without / measured, 2),
                        "with / measured": round(result.predicted_seconds_per_batch / measured, 2)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    parser.add_argument("--models", default=",".join(m for m, _ in MODELS), help="comma-separated example models")
    parser.add_argument("--runs", type=int, default=1, help="profile and verify everything this many times (the "
                                                            "tiny models' replays vary from run to run)")
    args = parser.parse_args()
    if int(os.environ.get("TBS_LOGICAL_CPUS", "1")) < 2:
        raise SystemExit("run with TBS_LOGICAL_CPUS=2: the placements split the model over cpu:0 and cpu:1")
    wanted = args.models.split(",")
    backends.choose("jax")  # before the example models import Keras: JAX with TBS_LOGICAL_CPUS devices
    rows = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            for name, batch in MODELS:
                if name in wanted:
                    rows += [dict(run=run, **row) for row in rows_for(name, batch, Path(tmp))]
    frame = pd.DataFrame(rows)
    error = {key: np.expm1(np.abs(np.log(frame[f"{key} / measured"].astype(float)))) for key in ("without", "with")}
    per_run = "; ".join(
        f"run {run}: {error['without'][g.index].median():.0%} and {error['with'][g.index].median():.0%}, p90 "
        f"{error['without'][g.index].quantile(0.9):.0%} and {error['with'][g.index].quantile(0.9):.0%}"
        for run, g in frame.groupby("run"))
    command = (f"TBS_LOGICAL_CPUS=2 python benchmarks/verify_dispatch.py --runs {args.runs} "
               "--out benchmarks/verify_dispatch.md")
    text = ("# `--verify`: predicted with and without each program call's dispatch, against the measured replay\n\n"
            f"`{command}`: JAX, two "
            "logical CPUs of this machine, batch per row, times per batch. A split runs one compiled program per run "
            "of consecutive layers on one device; each call pays the dispatch measured with the profile.\n\n"
            + markdown(frame)
            + f"\nMedian error (|log(predicted / measured)| as a factor - 1): {error['without'].median():.0%} "
            f"without dispatch, {error['with'].median():.0%} with it; p90 {error['without'].quantile(0.9):.0%} and "
            f"{error['with'].quantile(0.9):.0%} ({len(frame)} placements; {per_run}).\n")
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
