"""The TBS paper's GPU decisions, re-derived from CPU profiles of its example models and the GPU model.

The paper measured an AMD EPYC 7302 (16 cores) beside an NVIDIA A100 40GB and saw: (1) the
conv and dense layers of the flowers CNN faster on the GPU, (2) its preprocessing layers a
little faster on the CPU and so cheaper per sample, (3) the RNN layer faster on the GPU only
above batch ~512. Here the CPU is this machine's (measured), the GPUs are predicted from the
CPU profile's work alone (a T4, and the paper's A100 40GB), priced at the catalog's on-demand
prices and the CPU at --cpu-usd-per-hour. Each claim is stated with the 90% bands.

    python benchmarks/seed_claims.py --out benchmarks/seed_claims.md     # 1-6 min on 2 cores (the VM's speed varies)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from common import build_example

import tbs  # noqa: E402

GPUS = ("t4", "a100-40gb")
RNN_BATCHES = [32, 128, 512, 2048]


def profile(name: str, batches: list[int], directory: Path, cpu_usd_per_hour: float,
            training: bool = False) -> tbs.Profile:
    """A CPU profile of an example model (kept from an earlier run in --dir when it finished)."""
    out = directory / (f"{name}_training" if training else name)
    if (out / "metadata.json").exists() and tbs.load(out).complete:
        return tbs.load(out)
    model = build_example(name, directory)
    return tbs.profile(model, batches, devices=["cpu:0"], out=out, progress=None, report=False,
                       prices={"cpu": cpu_usd_per_hour}, training=training)


def side_by_side(p: tbs.Profile, batch: int) -> pd.DataFrame:
    """Each layer's measured CPU row beside its predicted GPU rows at one batch size."""
    measured = p.summary[(p.summary["batch_size"] == batch) & p.summary["status"].isin(["ok", "noisy"])]
    table = measured[["layer", "layer_type", "category", "per_sample_s", "cost_per_sample_usd"]].rename(
        columns={"per_sample_s": "cpu_s", "cost_per_sample_usd": "cpu_usd"})
    for gpu in GPUS:
        rows = p.predictions[(p.predictions["device"] == gpu) & (p.predictions["batch_size"] == batch)
                             & (p.predictions["target"] == "layer")]
        part = rows[["layer", "per_sample_s", "low_s", "high_s", "cost_per_sample_usd", "reason"]].copy()
        part["low_s"] = part["low_s"] / batch
        part["high_s"] = part["high_s"] / batch
        part.columns = ["layer"] + [f"{gpu}_{c}" for c in ("s", "low_s", "high_s", "usd", "reason")]
        table = table.merge(part, on="layer", how="left")
    return table


def verdict(cpu: float, low: float, high: float) -> str:
    if pd.isna(low) or pd.isna(high):
        return "not predicted"
    if high < cpu:
        return "GPU faster (whole band)"
    if low > cpu:
        return "CPU faster (whole band)"
    return "band straddles the CPU"


def us(value: float) -> str:
    return "–" if pd.isna(value) else f"{value * 1e6:.3g} µs"


def flowers_lines(p: tbs.Profile, batch: int) -> list[str]:
    table = side_by_side(p, batch)
    lines = [f"cnn_flowers at batch {batch}, {p.mode}: per-sample time, measured CPU against predicted GPUs "
             f"(90% band)", "",
             "| layer | category | CPU (measured) | " + " | ".join(f"{g} predicted [band]" for g in GPUS)
             + " | T4 verdict | cheaper per sample on (T4 price vs CPU) |", "|---|---|---:|" + "---:|" * len(GPUS) + "---|---|"]
    for _, r in table.iterrows():
        cells = [f"{us(r[f'{g}_s'])} [{us(r[f'{g}_low_s'])}–{us(r[f'{g}_high_s'])}]" for g in GPUS]
        cheaper = "–"
        if pd.notna(r["t4_usd"]) and pd.notna(r["cpu_usd"]):
            cheaper = "CPU" if r["cpu_usd"] < r["t4_usd"] * (r["t4_low_s"] / r["t4_s"]) else (
                "T4" if r["cpu_usd"] > r["t4_usd"] * (r["t4_high_s"] / r["t4_s"]) else "either (band)")
        lines.append(f"| {r['layer']} | {r['category']} | {us(r['cpu_s'])} | " + " | ".join(cells)
                     + f" | {verdict(r['cpu_s'], r['t4_low_s'], r['t4_high_s'])} | {cheaper} |")
    return lines


def rnn_lines(p: tbs.Profile, layer_category: str = "rnn") -> list[str]:
    lines = [f"{p.metadata['model']['name']}: the recurrent layer per sample, CPU measured against GPUs predicted", "",
             "| batch | CPU (measured) | " + " | ".join(f"{g} predicted [band]" for g in GPUS) + " | verdict (A100) |",
             "|---:|---:|" + "---:|" * len(GPUS) + "---|"]
    for batch in p.batch_sizes:
        table = side_by_side(p, batch)
        row = table[table["category"] == layer_category].iloc[0]
        cells = [f"{us(row[f'{g}_s'])} [{us(row[f'{g}_low_s'])}–{us(row[f'{g}_high_s'])}]" for g in GPUS]
        lines.append(f"| {batch} | {us(row['cpu_s'])} | " + " | ".join(cells)
                     + f" | {verdict(row['cpu_s'], row['a100-40gb_low_s'], row['a100-40gb_high_s'])} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cpu-usd-per-hour", type=float, default=0.5)
    parser.add_argument("--dir", type=Path, default=None, help="keep the CPU profiles here (reused when complete)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        flowers = tbs.predict(profile("cnn_flowers", [32], directory, args.cpu_usd_per_hour), list(GPUS))
        flowers_training = tbs.predict(profile("cnn_flowers", [32], directory, args.cpu_usd_per_hour, True),
                                       list(GPUS))
        rnns = [tbs.predict(profile(name, RNN_BATCHES, directory, args.cpu_usd_per_hour), list(GPUS))
                for name in ("rnn_mnist", "rnn_sa")]
    lines = ["The TBS paper's claims from CPU profiles on this machine (2 cores) and the GPU model "
             f"(`python benchmarks/seed_claims.py`); CPU at ${args.cpu_usd_per_hour}/h, GPUs at the catalog's on-demand "
             "prices. Band = the GPU model's 90% band for the layer's kind. The augmentation layers do nothing in "
             "inference (Keras skips them): the training profile is where they run.", "", *flowers_lines(flowers, 32),
             "", *flowers_lines(flowers_training, 32)]
    for p in rnns:
        lines += ["", *rnn_lines(p)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
