"""How far the GPU model's predictions are from published GPU measurements it was not fitted on.

Leave one GPU out: fit the model's constants on the reference rows of every other GPU, predict
the held-out GPU's rows from its datasheet alone (SMs, peaks, bandwidth), and compare with
what was measured on it. Per held-out GPU and layer kind:

- median and 90th percentile of |log(predicted / measured)|, shown as a factor - 1 (25% = 1.25x);
- Spearman rank correlation of predicted and measured times;
- the 90% band's coverage (the band comes from the fitted rows' residuals per kind and regime, so it
  is held out too) and its median width (high / low), over all rows and over the compute-bound ones:
  gemm/conv/recurrent rows whose datasheet compute time (FLOPs / peak) is at least
  ``COMPUTE_BOUND_MEMORY``x their memory time (bytes / bandwidth) and at least ``COMPUTE_BOUND_S``;
- the cross-device ratio: for a shape measured on the held-out GPU and another GPU, predicted
  ratio against measured ratio (median |log| error, and how often the faster GPU is named right).

    python benchmarks/predict_gpu.py --out benchmarks/predict_gpu.md     # ~2-3 min
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from common import ROOT

from tbs.predictions.bands import regime  # noqa: E402
from tbs.predictions.gpu_model import band_factors, predict_frame  # noqa: E402
from tbs.predictions.reference import MIN_SOURCE_ROWS, fit_table, reference_table  # noqa: E402

TARGETS = {"median": math.log(1.25), "p90": math.log(2.0), "spearman": 0.9, "coverage": 0.85, "width": 3.0}
SHAPE = ["source", "op", "kind", "phase", "precision", "m", "n", "k", "count", "steps", "in_m", "in_n", "in_k",
         "flops", "bytes"]
MIN_PAIR_SHAPES = 20
OWN_SOURCE = "tbs"  # tbs's own GPU rows (tbs/predictions/reference/measured.csv)
COMPUTE_BOUND_MEMORY = 2.0  # compute-bound: datasheet compute time >= 2x memory time ...
COMPUTE_BOUND_S = 1e-4  # ... and >= 100 us (about 6 launches): what a launch or a wave's rounding cannot dominate


def _scored(test: pd.DataFrame, model) -> pd.DataFrame:
    """``test`` with ``model``'s predictions and 90% bands."""
    test = test.copy()
    test["predicted_s"] = predict_frame(test, model)
    factors = [band_factors(model, k, x, p) or (0.0, math.inf)  # the training folds' bands
               for k, x, p in zip(test["kind"], regime(test, model.launch_s), test["phase"])]
    test["low_s"] = test["predicted_s"] * np.array([f[0] for f in factors])
    test["high_s"] = test["predicted_s"] * np.array([f[1] for f in factors])
    return test


def held_out(table: pd.DataFrame) -> pd.DataFrame:
    """Every row predicted by a model fitted without its GPU, with that model's band."""
    parts = [_scored(table[table["device"] == device], fit_table(table[table["device"] != device]))
             for device in sorted(table["device"].unique())]
    out = pd.concat(parts, ignore_index=True)
    out["log_error"] = np.log(out["predicted_s"] / out["measured_s"])
    out["compute_bound"] = compute_bound(out)
    return out


def held_out_by_model(table: pd.DataFrame, published_model) -> pd.DataFrame:
    """tbs's own rows (source tbs), each model's predicted twice: by the model fitted on the published rows alone,
    and by one fitted on them plus tbs's rows of the other models (check-only models are never fitted on)."""
    own = table[table["source"] == OWN_SOURCE]
    parts = []
    for name in sorted(own["model"].unique()):
        rows = own[own["model"] == name]
        others = own[(own["model"] != name) & ~own["check_only"]]
        with_own = published_model if len(others) < MIN_SOURCE_ROWS else fit_table(  # under it: the same fit
            table[(table["source"] != OWN_SOURCE) | (table["model"] != name)])
        for fitted, label in ((published_model, "published rows only"), (with_own, "published + tbs's other models")):
            # priced as `tbs predict` prices a layer: no source's offset (the frame names none)
            parts.append(_scored(rows.drop(columns=["source"]), fitted).assign(fitted_on=label, source=OWN_SOURCE))
    out = pd.concat(parts, ignore_index=True)
    out["log_error"] = np.log(out["predicted_s"] / out["measured_s"])
    out["compute_bound"] = compute_bound(out)
    return out


def by_model_lines(rows: pd.DataFrame) -> list[str]:
    lines = ["| model | kind | fitted on | rows | median error | p90 error | median predicted / measured | "
             "band coverage |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for (name, kind, label), group in rows.groupby(["model", "kind", "fitted_on"], sort=True):
        s = summarise(group)
        ratio = math.exp(group["log_error"].median())
        lines.append(f"| {name}{' (check only)' if group['check_only'].any() else ''} | {kind} | {label} | {s['rows']} | "
                     f"{percent(s['median'])} | {percent(s['p90'])} | {ratio:.2f} | {s['coverage']:.0%} |")
    return lines


def compute_bound(rows: pd.DataFrame) -> pd.Series:
    """Compute-kind rows whose datasheet compute time dominates their memory time and launches."""
    compute = rows["flops"] / rows["peak_flops_per_s"]
    memory = rows["bytes"] / rows["bandwidth_bytes_per_s"]
    return (rows["kind"] != "memory") & (compute >= COMPUTE_BOUND_MEMORY * memory) & (compute >= COMPUTE_BOUND_S)


def summarise(rows: pd.DataFrame) -> dict:
    errors = rows["log_error"].abs()
    rho = spearmanr(rows["predicted_s"], rows["measured_s"]).statistic if len(rows) > 2 else float("nan")
    covered = (rows["measured_s"] >= rows["low_s"]) & (rows["measured_s"] <= rows["high_s"])
    width = rows["high_s"] / rows["low_s"]
    bound = rows["compute_bound"].to_numpy(dtype=bool)
    return {"rows": int(len(rows)), "median": float(errors.median()), "p90": float(errors.quantile(0.9)),
            "spearman": float(rho), "coverage": float(covered.mean()), "width": float(width.median()),
            "compute_bound_rows": int(bound.sum()), "compute_bound_coverage": float(covered[bound].mean()) if bound.any() else math.nan,
            "compute_bound_width": float(width[bound].median()) if bound.any() else math.nan}


def ratio_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """Pairs of GPUs that measured the same shape: predicted against measured ratio of their times."""
    keyed = rows.assign(key=rows[SHAPE].astype(str).agg("|".join, axis=1))
    merged = keyed.merge(keyed, on="key", suffixes=("", "_other"))
    merged = merged[merged["device"] < merged["device_other"]]
    measured = np.log(merged["measured_s"] / merged["measured_s_other"])
    predicted = np.log(merged["predicted_s"] / merged["predicted_s_other"])
    return pd.DataFrame({"pair": merged["device"] + " vs " + merged["device_other"], "error": (predicted - measured).abs(),
                         "right": np.sign(predicted) == np.sign(measured)})


def percent(log_value: float) -> str:
    return f"{math.exp(log_value) - 1:.0%}"


def table_lines(rows: pd.DataFrame) -> list[str]:
    lines = ["| held-out GPU | kind | rows | median error | p90 error | Spearman | band coverage | band width | "
             "compute-bound rows | compute-bound band width | meets target |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (device, kind), group in rows.groupby(["device", "kind"]):
        s = summarise(group)
        narrow = not s["compute_bound_rows"] or s["compute_bound_width"] <= TARGETS["width"]
        misses = [name for name, ok in (("median", s["median"] <= TARGETS["median"]), ("p90", s["p90"] <= TARGETS["p90"]),
                                        ("Spearman", s["spearman"] >= TARGETS["spearman"]),
                                        ("coverage", s["coverage"] >= TARGETS["coverage"]), ("width", narrow)) if not ok]
        lines.append(f"| {device} | {kind} | {s['rows']} | {percent(s['median'])} | {percent(s['p90'])} | "
                     f"{s['spearman']:.3f} | {s['coverage']:.0%} | {s['width']:.2f}x | {bound_cells(s)} | "
                     f"{'yes' if not misses else 'no: ' + ', '.join(misses)} |")
    return lines


def bound_cells(s: dict) -> str:
    """The compute-bound rows' count and band width (blank width where there are none)."""
    return f"{s['compute_bound_rows']} | " + (f"{s['compute_bound_width']:.2f}x" if s["compute_bound_rows"] else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    table = reference_table()
    rows = held_out(table)
    whole = fit_table(table)
    lines = [f"Leave-one-GPU-out over {len(table)} reference measurements "
             f"({', '.join(f'{s}: {n}' for s, n in table['source'].value_counts().items())}); "
             "`python benchmarks/predict_gpu.py`. Errors are |log(predicted/measured)| shown as a factor - 1. "
             f"Compute-bound: gemm/conv/recurrent rows whose datasheet compute time (FLOPs / peak) is at least "
             f"{COMPUTE_BOUND_MEMORY:g}x their memory time (bytes / bandwidth) and at least {COMPUTE_BOUND_S * 1e6:g} us; "
             "band width is the median high / low.", "",
             "Per held-out GPU, all kinds:", "",
             "| held-out GPU | rows | median error | p90 error | Spearman | band coverage |", "|---|---:|---:|---:|---:|---:|",
             *[f"| {d} | {s['rows']} | {percent(s['median'])} | {percent(s['p90'])} | {s['spearman']:.3f} | {s['coverage']:.0%} |"
               for d, s in ((d, summarise(g)) for d, g in rows.groupby("device"))],
             "", "Per held-out GPU and kind:", "", *table_lines(rows), "", "All held-out rows per kind:", "",
             "| kind | rows | median error | p90 error | Spearman | band coverage | band width | "
             "compute-bound rows | compute-bound band width |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, group in rows.groupby("kind"):
        s = summarise(group)
        lines.append(f"| {kind} | {s['rows']} | {percent(s['median'])} | {percent(s['p90'])} | {s['spearman']:.3f} | "
                     f"{s['coverage']:.0%} | {s['width']:.2f}x | {bound_cells(s)} |")
    ratios = ratio_errors(rows)
    lines += ["", f"Cross-device ratios (the same shape measured on two GPUs, each predicted with its own GPU held out; "
                  f"pairs with at least {MIN_PAIR_SHAPES} shapes):", "",
              "| GPU pair | shapes | median ratio error | faster GPU named right |", "|---|---:|---:|---:|"]
    for pair, group in ratios.groupby("pair"):
        if len(group) < MIN_PAIR_SHAPES:
            continue
        lines.append(f"| {pair} | {len(group)} | {percent(group['error'].median())} | {group['right'].mean():.0%} |")
    published = fit_table(table[table["source"] != OWN_SOURCE])
    lines += ["", "tbs's own GPU rows (`measured.csv`: the layers tbs measured on a GPU, described by the CPU profile's "
                  "work as `tbs predict` describes them), held out by model: each model's rows predicted as `tbs predict` "
                  "prices a layer (no source's offset) by the model fitted on the published rows alone, and by one "
                  "fitted on them plus tbs's rows of the other models. The image classifiers are never fitted on "
                  "(check only), and a source under 50 fittable rows is not fitted on (the two fits are then one). A cell "
                  "shorter than one iteration of its timing loop is not a row (measured.py).", "",
              *by_model_lines(held_out_by_model(table, published))]
    lines += ["", "Constants fitted on every row (what `tbs predict` uses): "
              + ", ".join(f"{k} {v:.3g}" for k, v in whole.constants().items()), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
        rows_path = ROOT / "benchmarks" / "rows" / "predict_gpu.json"
        summaries = {f"{device}/{kind}": summarise(group) for (device, kind), group in rows.groupby(["device", "kind"])}
        rows_path.write_text(json.dumps({"constants": whole.constants(), "bands": whole.bands, "regime_bands": whole.regime_bands,
                                         "held_out": summaries}, indent=1, default=float))


if __name__ == "__main__":
    main()
