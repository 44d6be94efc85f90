"""How good tbs predict is, on cells that were measured: predict them from other measured cells.

Two tests of the same roofline scaling that `tbs predict` uses for catalog devices:

- across device configurations with different ceilings: each example model is profiled twice
  on this machine's CPU, once pinned to one core (``taskset -c 0``) and once on both; each
  configuration's per-layer and whole-model times are predicted from the other's, the target
  described only by its own calibration (matmul FLOP/s and bandwidth), as a catalog device is;
- across batch sizes on one configuration: the largest batch size's cells from the two smaller
  ones (the per-layer overhead + work fit), with the compiler's FLOPs and bytes at each size.

Errors are predicted/measured - 1 per cell; the table gives the median and 90th percentile of
|error| over layers, and the whole-model error per model. On a GPU machine, the same script
with --backend jax and --devices cpu,gpu predicts GPU from CPU and back (not run here: no GPU).

    python benchmarks/predict.py --out benchmarks/predict.md     # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from common import ROOT, build_example

import tbs  # noqa: E402
from tbs.predictions.predictor import (MATMUL_CATEGORIES, fit_layer, measured_device, predict_rows, predict_seconds,
                                      source_ceilings)

MODELS = {"nn_twins": [32, 128, 512], "lm_imdb": [32, 64, 256], "rnn_sa": [8, 16, 64],
          "lstm_sunspots": [32, 64, 256], "cnn_flowers": [4, 8, 16]}
CONFIGS = {"1 core": ["taskset", "-c", "0"], "2 cores": []}
USABLE = ("ok", "noisy")


def profile(model: Path, batches: list[int], out: Path, prefix: list[str], backend: str) -> tbs.Profile:
    if (out / "metadata.json").exists() and tbs.load(out).complete:
        return tbs.load(out)  # kept from an earlier run (--dir): the method can change without measuring again
    command = [*prefix, sys.executable, "-m", "tbs", "profile", str(model), "--batch", ",".join(map(str, batches)),
               "--devices", "cpu:0", "--backend", backend, "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    return tbs.load(out)


def _errors(predicted: pd.DataFrame, measured: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    measured = measured[measured["status"].isin(USABLE)].rename(columns={"bound": "measured_bound"})
    both = predicted.merge(measured[keys + ["median_s", "measured_bound"]], on=keys, suffixes=("_predicted", "_measured"))
    both = both[(both["median_s_measured"] > 0) & both["median_s_predicted"].notna()]
    return both.assign(error=both["median_s_predicted"] / both["median_s_measured"] - 1.0)


def across_configs(source: tbs.Profile, target: tbs.Profile) -> pd.DataFrame:
    """The target configuration's cells predicted from the source's (target known by its calibration only)."""
    device = measured_device("cpu:0", "cpu", target.metadata["calibration"]["cpu:0"])
    rows = pd.DataFrame(predict_rows(source, device, "cpu:0", {"flops": 1.0, "bandwidth": 1.0}))
    rows = rows[rows["median_s"].notna()].rename(columns={"median_s": "median_s"})
    layers = _errors(rows[rows["target"] == "layer"], target.summary, ["layer", "batch_size"])
    model = _errors(rows[rows["target"] == "model"].drop(columns="layer"), target.model, ["batch_size"])
    return pd.concat([layers.assign(target="layer"), model.assign(target="model")], ignore_index=True)


def across_batches(p: tbs.Profile) -> pd.DataFrame:
    """Each layer's largest batch size predicted from its fit on the smaller ones, on the same configuration."""
    src = source_ceilings(p.metadata["calibration"]["cpu:0"], "float32")
    out = []
    for target_name, frame in (("layer", p.summary), ("model", p.model.assign(layer="(model)", category="model"))):
        frame = frame[frame["status"].isin(USABLE)].dropna(subset=["flops", "bytes_accessed", "median_s"])
        for layer, group in frame.groupby("layer"):
            group = group.sort_values("batch_size")
            if len(group) < 3:
                continue
            matmul = group["category"].iloc[0] in MATMUL_CATEGORIES or target_name == "model"
            work = list(zip(group["flops"], group["bytes_accessed"]))
            fit = fit_layer([(max(src.roofline_s(*w, matmul)), t) for w, t in zip(work[:-1], group["median_s"][:-1])])
            last = group.iloc[-1]
            guess = predict_seconds(group["median_s"].iloc[-2], work[-1], src, src, matmul, True, fit)
            out.append({"target": target_name, "layer": layer, "batch_size": last["batch_size"],
                        "measured_bound": last["bound"], "error": guess / last["median_s"] - 1.0})
    return pd.DataFrame(out)


def stats(errors: pd.DataFrame) -> dict[str, float | int | None]:
    layers = errors[errors["target"] == "layer"]
    bound = layers[layers["measured_bound"].isin(["compute", "memory"])]["error"].abs()
    layers, model = layers["error"].abs(), errors[errors["target"] == "model"]["error"]
    return {"layers": int(len(layers)),
            "median_abs": float(layers.median()) if len(layers) else None,
            "p90_abs": float(np.percentile(layers, 90)) if len(layers) else None,
            "bound_layers": int(len(bound)), "bound_median_abs": float(bound.median()) if len(bound) else None,
            "model_errors": [float(e) for e in model]}


def _pct(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def table(results: dict[str, dict[str, dict]]) -> str:
    lines = ["| model | prediction | layer cells | median \\|error\\| | p90 \\|error\\| "
             "| compute/memory-bound cells: median \\|error\\| | whole model error(s) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for model, tests in results.items():
        for name, s in tests.items():
            whole = ", ".join(f"{e:+.0%}" for e in s["model_errors"])
            bound = f"{_pct(s.get('bound_median_abs'))} ({s.get('bound_layers', 0)})" if s.get("bound_layers") else "–"
            lines.append(f"| {model} | {name} | {s['layers']} | {_pct(s['median_abs'])} | {_pct(s['p90_abs'])} "
                         f"| {bound} | {whole} |")
    return "\n".join(lines)


def summary_line(results: dict[str, dict[str, dict]], key: str) -> str:
    whole = [abs(e) for tests in results.values() for name, s in tests.items() if key in name for e in s["model_errors"]]
    if not whole:
        return ""
    return (f"{key}: whole-model |error| median {np.median(whole):.0%}, max {max(whole):.0%} over {len(whole)} "
            f"predictions; {sum(w < 0.2 for w in whole)} of {len(whole)} within 20%.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "jax"])
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    parser.add_argument("--dir", type=Path, default=None, help="keep the profiles here and reuse them next time")
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {}
    ceilings: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.dir or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            model = build_example(name, Path(tmp))
            runs = {c: profile(model, MODELS[name], Path(tmp) / f"{name}-{c.replace(' ', '')}", prefix, args.backend)
                    for c, prefix in CONFIGS.items()}
            for c, p in runs.items():
                calibration = p.metadata["calibration"]["cpu:0"]
                ceilings[c] = {"gflops": calibration["matmul_flops_per_s"]["float32"] / 1e9,
                               "gb_per_s": calibration["memory_bytes_per_s"] / 1e9}
            (one, two) = runs["1 core"], runs["2 cores"]
            results[name] = {
                "2 cores from 1 core": stats(across_configs(one, two)),
                "1 core from 2 cores": stats(across_configs(two, one)),
                "largest batch from the smaller two (2 cores)": stats(across_batches(two)),
            }
            print(name, json.dumps(results[name]), flush=True)
    text = [table(results), "", summary_line(results, "from"), summary_line(results, "largest batch"), "",
            "Calibrated ceilings (last model's runs): " + "; ".join(
                f"{c}: {v['gflops']:.0f} GFLOP/s, {v['gb_per_s']:.1f} GB/s" for c, v in ceilings.items()),
            f"Backend {args.backend}; batch sizes {', '.join(f'{m} {b}' for m, b in MODELS.items() if m in results)}."]
    report = "\n".join(t for t in text if t is not None)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
        (ROOT / "benchmarks" / "rows").mkdir(exist_ok=True)
        (ROOT / "benchmarks" / "rows" / "predict.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
