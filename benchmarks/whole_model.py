"""Whole-model GPU predictions from the fused program against published whole-model latencies.

For every row of tbs/predictions/reference/whole_models.csv (NVIDIA DeepLearningExamples' inference tables,
batch <= 32), the model is rebuilt in Keras (benchmarks/whole_models.py), its whole forward compiled for this
CPU, its optimised program's kernels read (tbs.backends.hlo_kernels) and priced on the published GPU at the
published precision (tbs.predictions.whole). The per-step host overhead and the 90% band are the only things
fitted, each on the non-classifier models held out by model (leave one model out: a model's rows are scored
with a constant and a band fitted without them); the image classifiers (ResNet-50) are never fitted on and are
scored with the constants fitted on every other model.

Usage: python benchmarks/whole_model.py [--out benchmarks/whole_model.md]   (fills the kernel cache first:
python benchmarks/whole_models.py, one CPU compile per configuration)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import whole_models  # noqa: E402

from tbs.predictions.catalog import load_catalog  # noqa: E402
from tbs.predictions.gpu_model import GpuModel  # noqa: E402
from tbs.predictions.gpu_predict import gpu_spec  # noqa: E402
from tbs.predictions.reference import fitted_model, gpu_specs  # noqa: E402
from tbs.predictions.whole import predict_whole  # noqa: E402

TABLE = HERE.parent / "tbs" / "predictions" / "reference" / "whole_models.csv"
MAX_BATCH = 32
OVERHEADS_S = np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 120)])
TAIL = 0.05


def specs() -> dict:
    """The published GPUs' datasheets: the catalog's (A100 SXM4, T4) and the reference V100 SXM2."""
    catalog = load_catalog()
    out = {gpu: gpu_spec(catalog[gpu]) for gpu in ("a100-40gb", "a100-80gb", "t4")}
    out["v100"] = gpu_specs()["v100"]
    return out


def kernel_seconds(table: pd.DataFrame, model: GpuModel, fold: bool) -> np.ndarray:
    """Each row's kernels' predicted seconds (no host overhead)."""
    found = specs()
    out = []
    for row in table.itertuples():
        sequence = int(row.sequence_length) if row.sequence_length == row.sequence_length else None
        kernels = whole_models.kernels(row.model, sequence, int(row.batch_size), row.precision == "fp16")
        out.append(predict_whole(kernels, found[row.device], row.precision, model, 0.0, fold_epilogues=fold).seconds)
    return np.array(out)


def fit_overhead(kernels_s: np.ndarray, published_s: np.ndarray) -> float:
    """The per-step host overhead that minimises the median |log error|."""
    errors = [np.median(np.abs(np.log((kernels_s + c) / published_s))) for c in OVERHEADS_S]
    return float(OVERHEADS_S[int(np.argmin(errors))])


def held_out(table: pd.DataFrame, kernels_s: np.ndarray) -> pd.DataFrame:
    """Each row's prediction and band, its constants fitted without its model (classifiers: on every other)."""
    out = table.copy()
    published = table["latency_s"].to_numpy(dtype=float)
    fitted = ~table["classifier"].to_numpy(dtype=bool)
    overhead, low, high = np.zeros(len(table)), np.zeros(len(table)), np.zeros(len(table))
    for model in table["model"].unique():
        rows = (table["model"] == model).to_numpy()
        train = fitted & ~rows
        c = fit_overhead(kernels_s[train], published[train])
        errors = np.log(published[train] / (kernels_s[train] + c))
        overhead[rows], low[rows], high[rows] = c, np.quantile(errors, TAIL), np.quantile(errors, 1 - TAIL)
    out["predicted_s"] = kernels_s + overhead
    out["kernels_s"] = kernels_s
    out["host_overhead_s"] = overhead
    out["low_s"], out["high_s"] = out["predicted_s"] * np.exp(low), out["predicted_s"] * np.exp(high)
    out["log_error"] = np.log(out["predicted_s"] / published)
    out["covered"] = (published >= out["low_s"]) & (published <= out["high_s"])
    return out


def summary(scored: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, group in scored.groupby(by):
        error = np.abs(group["log_error"])
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "rows": len(group),
                     "median error": f"{np.expm1(np.median(error)):.0%}", "p90 error": f"{np.expm1(np.quantile(error, 0.9)):.0%}",
                     "median predicted / published": f"{np.exp(np.median(group['log_error'])):.2f}",
                     "band coverage": f"{group['covered'].mean():.0%}"})
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in frame.itertuples(index=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "whole_model.md"))
    args = parser.parse_args()
    table = pd.read_csv(TABLE)
    table = table[table["batch_size"] <= MAX_BATCH].reset_index(drop=True)
    sequences = [int(s) if s == s else None for s in table["sequence_length"]]
    ready = np.array([whole_models.cached(m, s, p == "fp16") for m, s, p in zip(table["model"], sequences,
                                                                                 table["precision"])])
    left_out = table[~ready].groupby(["model", "precision"]).size()
    table = table[ready].reset_index(drop=True)
    model = fitted_model()
    parts = []
    for fold in (True, False):
        scored = held_out(table, kernel_seconds(table, model, fold))
        fitted = scored[~scored["classifier"]]
        c = fit_overhead(fitted["kernels_s"].to_numpy(), fitted["latency_s"].to_numpy())
        errors = np.log(fitted["latency_s"] / (fitted["kernels_s"] + c))
        title = "GPU epilogues folded (bias/activation passes after a GEMM dropped)" if fold else "CPU fusions as compiled"
        parts.append(f"## {title}\n\nShipped constants (fitted on every non-classifier row): host overhead "
                     f"{c * 1e3:.2f} ms per step, band x{np.exp(np.quantile(errors, TAIL)):.2f} to "
                     f"x{np.exp(np.quantile(errors, 1 - TAIL)):.2f}.\n\n"
                     f"Held-out models (non-classifiers), per GPU:\n\n"
                     f"{markdown(summary(fitted, ['device']))}\nPer model, GPU and precision:\n\n"
                     f"{markdown(summary(fitted, ['model', 'device', 'precision']))}\n"
                     f"Independent check, image classifiers (never fitted on), per GPU:\n\n"
                     f"{markdown(summary(scored[scored['classifier']], ['device']))}\nPer GPU and precision:\n\n"
                     f"{markdown(summary(scored[scored['classifier']], ['model', 'device', 'precision']))}\n")
        scored.to_csv(HERE / "rows" / f"whole_model{'' if fold else '-cpu-fusions'}.csv", index=False)
    text = (f"# Whole-model GPU predictions against published latencies\n\n`python benchmarks/whole_model.py`: "
            f"{len(table)} rows of {TABLE.name} (batch <= {MAX_BATCH}; NVIDIA DeepLearningExamples, each row's licence "
            f"in its `license` column). The shipped prediction folds the epilogues (the first section); the "
            f"second scores the CPU's fusions as compiled, to show what that choice does. "
            f"Errors are |log(predicted / published)| shown as a factor - 1; each non-classifier model's rows are "
            f"scored with the host overhead and band fitted without that model."
            + (f" Not scored (their programs were not compiled here: {', '.join(f'{m} {p}' for m, p in left_out.index)}, "
               f"{int(left_out.sum())} rows)." if len(left_out) else "") + "\n\n" + "\n".join(parts))
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
