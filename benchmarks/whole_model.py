"""Whole-model GPU predictions from the fused program against published whole-model latencies.

For every row of tbs/predictions/reference/whole_models.csv (NVIDIA DeepLearningExamples' inference tables,
batch <= 32), the model is rebuilt in Keras (benchmarks/whole_models.py), its whole forward compiled for this
CPU, its optimised program's kernels read (tbs.backends.hlo_kernels) and priced on the published GPU at the
published precision (tbs.predictions.whole). The only things fitted are three constants of a compiled
program (the share of the TF32 peak reached, each kernel's launch interval, the per-step host overhead; the clock
is the base clock, CLOCKS) and the 95% band, each on the non-classifier models held out by model (leave one model out: a model's rows are scored
with constants fitted without them, and a band from the other models' held-out residuals); the image classifiers
(ResNet-50) are never fitted on and are scored with the constants fitted on every other model.

Usage: python benchmarks/whole_model.py [--out benchmarks/whole_model.md]   (about 5 minutes on 2 cores once the
kernel cache is filled: python benchmarks/whole_models.py, one CPU compile per configuration, a half-precision
BERT-large's about 3 minutes each; the XLA:GPU programs' section once benchmarks/gpu_programs.py has compiled them,
about 20 minutes, else it says they are missing)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_programs  # noqa: E402
import whole_models  # noqa: E402
from common import markdown  # noqa: E402

from tbs.predictions.catalog import load_catalog  # noqa: E402
from tbs.predictions.gpu_model import GpuModel, gemm_shapes, predict_frame  # noqa: E402
from tbs.predictions.gpu_predict import gpu_spec  # noqa: E402
from tbs.predictions.reference import fitted_model, gpu_specs  # noqa: E402
from tbs.predictions.whole import program_frame, program_model  # noqa: E402

TABLE = HERE.parent / "tbs" / "predictions" / "reference" / "whole_models.csv"
MAX_BATCH = 32
OVERHEADS_S = np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 120)])  # per-step host overhead
KERNELS_S = np.concatenate([[0.0], np.geomspace(5e-7, 3e-5, 60)])  # each kernel's launch interval
# The clock a GPU sustains, as the way from base (0) to boost (1): the base clock, the one NVIDIA guarantees at the
# board's TDP, which a published steady state (about 1,000 batches back to back) runs at. It was fitted over (0,
# 0.25, 0.5, 1) until 2026-11-27: the fit on every row chose 0, but each fit with one model held out used it to
# trade against the other constants (BERT-base held out: a quarter of the way, 0.8 us a kernel and 4.9 ms a step,
# which read BERT-base 1.6x slow on the A100 80GB); fixed, the held-out fits find 3.6-5.7 us and 0.8-2.0 ms.
CLOCKS = (0.0,)
TF32 = (1.0, 0.8, 0.65, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25)  # share of the TF32 peak reached
TAIL = 0.025  # the band: 2.5th to 97.5th percentile (95%)
TAIL_90 = 0.05  # the 90% band, scored beside it to show why the shipped band is 95%
WITHIN = np.log(1.25)  # issue 30's target median error, as a |log error|
# The fit's loss: the mean |log error|, each row's capped at this (1.65x). The median it minimised before is flat
# and jumps: a 1% move of the GPU model's shared constants (the RNN step refit, 2026-11-27) moved two held-out
# models to other optima and the A100 80GB from 14% to 40% median error. The capped mean gives the same constants
# and the same scores (93-94% inside the band) under either set of shared constants; the cap keeps the T4's two
# disagreeing tables (1.7x apart) from pulling the fit as a plain mean does.
LOSS_CAP = np.log(1.65)


def specs() -> dict:
    """The published GPUs' datasheets: the catalog's (A100 SXM4, T4) and the reference V100 SXM2."""
    catalog = load_catalog()
    out = {gpu: gpu_spec(catalog[gpu]) for gpu in ("a100-40gb", "a100-80gb", "t4")}
    out["v100"] = gpu_specs()["v100"]
    return out


# Where each row's program comes from: the CPU's compile with a GPU library's epilogues folded (what tbs ships),
# the CPU's compile as it is, or XLA:GPU's own compile for the row's GPU (benchmarks/gpu_programs.py).
SOURCES = ("folded", "cpu", "gpu")


def row_kernels(row, source: str) -> list[dict]:
    """One published row's program's kernels from ``source``."""
    sequence = int(row.sequence_length) if row.sequence_length == row.sequence_length else None
    half = row.precision == "fp16"
    if source == "gpu":
        return gpu_programs.gpu_kernels(row.device, row.model, sequence, int(row.batch_size), half)
    kernels = whole_models.kernels(row.model, sequence, int(row.batch_size), half)
    return [k for k in kernels if not (source == "folded" and k.get("epilogue"))]


def gpu_compiled(table: pd.DataFrame) -> bool:
    """Whether XLA:GPU's program of every row is compiled (benchmarks/gpu_programs.py)."""
    return all(gpu_programs.program_path(r.device, r.model, int(r.sequence_length) if r.sequence_length == r.sequence_length
                                         else None, int(r.batch_size), r.precision == "fp16").exists()
               for r in table.itertuples())


def program_frames(table: pd.DataFrame, source: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Every row's kernels as one GPU-model table (TF32 at its full peak), each kernel's row of ``table`` and its
    repeats."""
    found = specs()
    frames, owner, repeats = [], [], []
    for index, row in enumerate(table.itertuples()):
        kernels = row_kernels(row, source)
        frames.append(program_frame(kernels, found[row.device], row.precision, 1.0))
        owner += [index] * len(kernels)
        repeats += [float(k.get("repeat", 1)) for k in kernels]
    return pd.concat(frames, ignore_index=True), np.array(owner), np.array(repeats)


Parts = dict[tuple[float, float], tuple[np.ndarray, np.ndarray]]


def row_parts(table: pd.DataFrame, model: GpuModel, source: str) -> Parts:
    """Per (sustained clock, TF32 efficiency): each row's kernels' seconds without launches, and its seconds per
    second of kernel_s (a row's prediction is linear in kernel_s and the host overhead: work + kernel_s x launches
    + host)."""
    frame, owner, repeats = program_frames(table, source)
    shapes = gemm_shapes(frame)
    peak = frame["peak_flops_per_s"].to_numpy()
    tf32 = (frame["precision"] == "tf32").to_numpy() & frame["tensor_cores"].to_numpy(dtype=bool)
    out = {}
    for efficiency in TF32:
        frame["peak_flops_per_s"] = np.where(tf32, peak * efficiency, peak)
        for clock in CLOCKS:
            work, unit = (predict_frame(frame, program_model(model, k, clock), shapes) * repeats for k in (0.0, 1e-5))
            out[clock, efficiency] = (np.bincount(owner, work, len(table)),
                                      np.bincount(owner, (unit - work) / 1e-5, len(table)))
    return out


def fit_loss(predicted_s: np.ndarray, published_s: np.ndarray) -> np.ndarray:
    """Each row's |log error| capped at LOSS_CAP, averaged over the rows (axis 0)."""
    return np.mean(np.minimum(np.abs(np.log(predicted_s / published_s)), LOSS_CAP), axis=0)


def fit(parts: Parts, published_s: np.ndarray, rows: np.ndarray) -> tuple[float, float, float, float]:
    """(sustained clock, TF32 efficiency, kernel_s, host overhead) minimising the capped mean |log error| over
    ``rows`` (LOSS_CAP)."""
    best: tuple[float, ...] = (np.inf, 0.0, 1.0, 0.0, 0.0)
    for (clock, efficiency), (work, launches) in parts.items():
        for kernel_s in KERNELS_S:
            predicted = work[rows, None] + kernel_s * launches[rows, None] + OVERHEADS_S[None, :]
            errors = fit_loss(predicted, published_s[rows, None])
            j = int(np.argmin(errors))
            if errors[j] < best[0]:
                best = (errors[j], clock, efficiency, kernel_s, float(OVERHEADS_S[j]))
    return best[1:]  # type: ignore[return-value]


def predicted(parts: Parts, constants: tuple[float, float, float, float]) -> np.ndarray:
    clock, efficiency, kernel_s, overhead = constants
    work, launches = parts[clock, efficiency]
    return work + kernel_s * launches + overhead


def held_out(table: pd.DataFrame, parts: Parts) -> pd.DataFrame:
    """Each row's prediction and band, its constants fitted without its model (classifiers: on every other).

    The band is cross-validated too: a non-classifier model's is the 2.5th and 97.5th percentiles of the other
    non-classifier models' held-out residuals (each from constants fitted without that model), so it carries how
    far apart models are, not only how well the constants fit the rows they were fitted on.
    """
    out = table.copy()
    published = table["latency_s"].to_numpy(dtype=float)
    fitted = ~table["classifier"].to_numpy(dtype=bool)
    prediction, constants = np.zeros(len(table)), {}
    for model in table["model"].unique():
        rows = (table["model"] == model).to_numpy()
        constants[model] = fit(parts, published, fitted & ~rows)
        prediction[rows] = predicted(parts, constants[model])[rows]
    residual = np.log(published / prediction)
    low, high, covered_90 = np.zeros(len(table)), np.zeros(len(table)), np.zeros(len(table), bool)
    for model in table["model"].unique():
        rows = (table["model"] == model).to_numpy()
        others = residual[fitted & ~rows]
        low[rows], high[rows] = np.quantile(others, TAIL), np.quantile(others, 1 - TAIL)
        inner = np.quantile(others, [TAIL_90, 1 - TAIL_90])
        covered_90[rows] = (residual[rows] >= inner[0]) & (residual[rows] <= inner[1])
    out["predicted_s"] = prediction
    out["sustained_clock"], out["tf32_efficiency"], out["kernel_s"], out["host_overhead_s"] = (
        table["model"].map(lambda m, i=i: constants[m][i]) for i in range(4))
    out["low_s"], out["high_s"] = prediction * np.exp(low), prediction * np.exp(high)
    out["log_error"] = np.log(prediction / published)
    out["covered"] = (published >= out["low_s"]) & (published <= out["high_s"])
    out["covered_90"] = covered_90
    return out


def summary(scored: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Errors and band coverage per group (with each group's band and a 90% band's coverage where ``scored`` has
    ``covered_90``; benchmarks/whole_training.py's rows do not)."""
    rows = []
    for key, group in scored.groupby(by):
        error = np.abs(group["log_error"])
        row = {**dict(zip(by, key if isinstance(key, tuple) else (key,))), "rows": len(group),
               "median error": f"{np.expm1(np.median(error)):.0%}", "p90 error": f"{np.expm1(np.quantile(error, 0.9)):.0%}",
               "median predicted / published": f"{np.exp(np.median(group['log_error'])):.2f}",
               "inside the 95% band": f"{group['covered'].mean():.0%}"}
        if "covered_90" in group:
            row["band (x prediction)"] = (f"x{np.median(group['low_s'] / group['predicted_s']):.2f}-"
                                          f"x{np.median(group['high_s'] / group['predicted_s']):.2f}")
            row["inside a 90% band"] = f"{group['covered_90'].mean():.0%}"
        rows.append(row)
    return pd.DataFrame(rows)


def _held_by_one_value(latencies: np.ndarray) -> int:
    """The most of one configuration's published latencies that a single predicted value holds within 25%."""
    logs = np.sort(np.log(latencies))
    return max(int(np.searchsorted(logs, x + 2 * WITHIN, side="right")) - i for i, x in enumerate(logs))


def agreement(table: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, how far NVIDIA's own tables agree where they publish one configuration (model, precision, tokens,
    batch) more than once: the spread between them, the median error of one value per configuration at the
    geometric mean of its rows (the best a prediction that does not know the table can do, row for row), and the
    share of rows that no single value per configuration holds within 25%."""
    key = ["model", "precision", "sequence_length", "batch_size"]
    rows = []
    for device, group in table.groupby("device"):
        configs = group.groupby(key, dropna=False)["latency_s"]
        spread = configs.agg(lambda x: x.max() / x.min())[configs.size() > 1]
        middle = np.exp(configs.transform(lambda x: np.log(x).mean()))
        outside = sum(len(x) - _held_by_one_value(x.to_numpy(float)) for _, x in configs)
        rows.append({"device": device, "rows": len(group), "configurations published more than once": len(spread),
                     "their slow / fast (median)": f"{spread.median():.2f}" if len(spread) else "",
                     "largest": f"{spread.max():.2f}" if len(spread) else "",
                     "one value per configuration at the geometric mean: median error":
                         f"{np.expm1(np.median(np.abs(np.log(group['latency_s'] / middle)))):.0%}",
                     "rows no single value holds within 25%": f"{outside / len(group):.0%}"})
    return pd.DataFrame(rows)


def agreement_section(table: pd.DataFrame, scored: pd.DataFrame) -> str:
    """What the published tables allow (how close a prediction of one number per configuration can come to them),
    and the shipped prediction per table where a GPU's tables disagree."""
    fitted = scored[~scored["classifier"]]
    return ("## What the published tables allow\n\nWhere NVIDIA publishes one configuration in more than one table "
            "(TensorFlow 1 and 2 containers), the tables disagree; no prediction that gives one number per "
            "configuration can be closer to both than they are to each other. Non-classifier rows:\n\n"
            f"{markdown(agreement(table[~table['classifier']]))}\nThe shipped prediction (first section) per table "
            f"on the T4:\n\n{markdown(summary(fitted[fitted['device'] == 't4'], ['framework', 'precision']))}")


TITLES = {"folded": "GPU epilogues folded (bias/activation passes after a GEMM dropped)",
          "cpu": "CPU fusions as compiled",
          "gpu": "XLA:GPU's own program (compiled for each row's GPU, without one)"}
ROW_FILES = {"folded": "", "cpu": "-cpu-fusions", "gpu": "-gpu-programs"}
CONSTANTS: dict[str, dict] = {}  # each source's constants fitted on every non-classifier row, and its band
CONSTANTS_FILE = HERE / "rows" / "whole_model_constants.json"  # what whole_training.py prices each source with


def scored_section(table: pd.DataFrame, model: GpuModel, source: str) -> tuple[pd.DataFrame, str]:
    """Every row scored held out by model with ``source``'s programs, and its section of the page."""
    parts = row_parts(table, model, source)
    scored = held_out(table, parts)
    fitted = scored[~scored["classifier"]]
    clock, efficiency, kernel_s, c = fit(parts, table["latency_s"].to_numpy(dtype=float),
                                         ~table["classifier"].to_numpy(bool))
    errors = np.log(fitted["latency_s"] / fitted["predicted_s"])
    CONSTANTS[source] = {"sustained_clock": clock, "tf32_efficiency": efficiency, "kernel_s": kernel_s,
                         "host_overhead_s": c, "band": [float(np.exp(np.quantile(errors, q))) for q in (TAIL, 1 - TAIL)]}
    each = "; ".join(f"{m}: clock {g['sustained_clock'].iloc[0]:.2f}, TF32 {g['tf32_efficiency'].iloc[0]:.2f}, "
                     f"{g['kernel_s'].iloc[0] * 1e6:.2f} us, {g['host_overhead_s'].iloc[0] * 1e3:.2f} ms"
                     for m, g in fitted.groupby("model"))
    classifiers = scored[scored["classifier"]]
    return scored, (
        f"## {TITLES[source]}\n\n{'Shipped constants' if source == 'folded' else 'Constants'} (fitted on every "
        f"non-classifier row): sustained clock "
        f"{clock:.2f} of the way from base to boost, TF32 at {efficiency:.2f} of its peak, {kernel_s * 1e6:.2f} us "
        f"per kernel, host overhead {c * 1e3:.2f} ms per step; 95% band (the held-out residuals' 2.5th and 97.5th "
        f"percentiles) x{np.exp(np.quantile(errors, TAIL)):.2f} to x{np.exp(np.quantile(errors, 1 - TAIL)):.2f}.\n\n"
        f"Constants fitted without each model: {each}.\n\n"
        f"Held-out models (non-classifiers), per GPU ({fitted['covered'].mean():.1%} of all {len(fitted)} "
        f"inside their 95% band, {fitted['covered_90'].mean():.1%} inside a 90% band):\n\n"
        f"{markdown(summary(fitted, ['device']))}\nPer model, GPU and precision:\n\n"
        f"{markdown(summary(fitted, ['model', 'device', 'precision']))}\n"
        f"Independent check, image classifiers (never fitted on), per GPU:\n\n"
        f"{markdown(summary(classifiers, ['device']))}\nPer GPU and precision:\n\n"
        f"{markdown(summary(classifiers, ['model', 'device', 'precision']))}\n")


# The H200 machine's own programs (issue 29's profiles): each model row keeps its program's kernels, read when it
# was measured. model -> (profile folder, its sequence length in gpu_programs' configurations).
H200_PROFILES = {"resnet50": ("resnet50", None), "bert_encoder": ("bert_base", 128)}


@functools.cache
def h200_programs(folder: str) -> dict[int, list[dict]]:
    """The kernels of each whole-model program the H200 machine compiled for itself, by batch (profiles/h200/
    ``folder``/inference: its model rows' analysis, read when it measured them)."""
    analysis = pd.read_csv(HERE.parent / "profiles" / "h200" / folder / "inference" / "analysis.csv")
    mine = analysis[(analysis["target"] == "model") & analysis["device"].str.startswith("gpu")]
    return {int(row.batch_size): json.loads(row.kernels) for row in mine.itertuples()}


def deviceless_check() -> str:
    """XLA:GPU's programs compiled here for the H200 without one, against the programs the H200 machine compiled
    for itself (profiles/h200/*/inference)."""
    title = "## Check: a deviceless compile against the GPU's own\n\n"
    rows = []
    for model, (folder, sequence) in H200_PROFILES.items():
        for batch, own in h200_programs(folder).items():
            if not gpu_programs.program_path("h200", model, sequence, batch, False).exists():
                continue
            here = gpu_programs.gpu_kernels("h200", model, sequence, batch, False)
            counts = [Counter(k["kind"] for k in program) for program in (own, here)]
            memory = [sum(k["bytes"] for k in program if k["kind"] == "memory") / 1e6 for program in (own, here)]
            flops = [sum(k["flops"] for k in program) / 1e9 for program in (own, here)]
            rows.append({"model": model, "batch": batch,
                         **{f"{kind} kernels (H200 / here)": f"{counts[0][kind]} / {counts[1][kind]}"
                            for kind in ("memory", "conv", "gemm")},
                         "memory passes' MB (H200 / here)": f"{memory[0]:.1f} / {memory[1]:.1f}",
                         "GFLOP (H200 / here)": f"{flops[0]:.2f} / {flops[1]:.2f}"})
    if not rows:
        return title + "Not checked: the H200's programs are not compiled here (benchmarks/gpu_programs.py).\n"
    return (title + "keras.applications ResNet-50 and models/build.py's BERT-base-sized encoder (FP32) as the H200 "
            "machine compiled them for itself (XLA with autotuning, profiles/h200/*/inference) and as XLA:GPU "
            "compiles them on this CPU-only machine for an H200 described, not found (benchmarks/gpu_programs.py). "
            "The H200's kernels were read when it measured them, before a gather was read as the rows it gathers: "
            "the encoder's embedding lookup there counts its 94 MB table, here its 12.6 MB of rows.\n\n"
            + markdown(pd.DataFrame(rows)))


def h200_measured_check() -> str:
    """ResNet-50's whole model as the H200 machine measured it (profiles/h200/resnet50), against the shipped
    prediction from this CPU's program (epilogues folded) and the H200's own program priced the same way."""
    from tbs.predictions.gpu_predict import precision_of
    from tbs.predictions.whole import predict_whole

    measured = pd.read_csv(HERE.parent / "profiles" / "h200" / "resnet50" / "inference" / "model.csv")
    programs = h200_programs("resnet50")
    target = load_catalog()["h200"]
    spec, precision, model = gpu_spec(target), precision_of(target), fitted_model()
    rows = []
    for row in measured[measured["device"] == "gpu:0"].itertuples():
        batch = int(row.batch_size)
        cpu = predict_whole(whole_models.kernels("resnet50", None, batch, False), spec, precision, model, 0.0)
        gpu = predict_whole(programs[batch], spec, precision, model, 0.0) if batch in programs else None
        rows.append({"batch": batch, "measured ms": f"{row.median_s * 1e3:.3g}",
                     "from this CPU's program ms (x measured)": f"{cpu.seconds * 1e3:.3g} "
                                                                 f"(x{cpu.seconds / row.median_s:.2f})",
                     "from the H200's own program ms (x measured)": f"{gpu.seconds * 1e3:.3g} "
                                                                    f"(x{gpu.seconds / row.median_s:.2f})" if gpu else ""})
    return ("## Check: ResNet-50 as the H200 measured it\n\n"
            "keras.applications ResNet-50 (FP32 weights, TF32 GEMMs) timed whole on the H200 by tbs (issue 29, "
            "program time per call, so no host overhead is added), against the shipped whole-model prediction from "
            f"this CPU's program ({precision}, epilogues folded) and against the kernels of the program the H200 "
            "compiled for itself, priced with the same constants:\n\n" + markdown(pd.DataFrame(rows)))


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
    sections, shipped = [], None
    sources = SOURCES if gpu_compiled(table) else SOURCES[:2]
    for source in sources:
        scored, section = scored_section(table, model, source)
        sections.append(section)
        scored.to_csv(HERE / "rows" / f"whole_model{ROW_FILES[source]}.csv", index=False)
        shipped = scored if source == "folded" else shipped
    if len(sources) < len(SOURCES):
        sections.append(f"## {TITLES['gpu']}\n\nNot scored: not every row's program is compiled for its GPU "
                        "(benchmarks/gpu_programs.py).\n")
    text = (f"# Whole-model GPU predictions against published latencies\n\n`python benchmarks/whole_model.py`: "
            f"{len(table)} rows of {TABLE.name} (batch <= {MAX_BATCH}; NVIDIA DeepLearningExamples, each row's licence "
            f"in its `license` column). The shipped prediction folds the epilogues (the first section); the "
            f"second scores the CPU's fusions as compiled, to show what that choice does; the third scores the "
            f"program XLA:GPU itself compiles for each row's GPU (benchmarks/gpu_programs.py, compiled here without "
            f"a GPU; the last section checks such a compile against the program an H200 compiled for itself). "
            f"Errors are |log(predicted / published)| shown as a factor - 1; each non-classifier model's rows are "
            f"scored with the constants (TF32 efficiency, per-kernel launch interval, host overhead; the clock is the base clock) fitted without "
            f"that model, and a 95% band from the other models' held-out residuals (a 90% band from the same residuals is "
            f"scored beside it: it holds 90% of all rows but under 85% on two GPUs)."
            + (f" Not scored (their programs were not compiled here: {', '.join(f'{m} {p}' for m, p in left_out.index)}, "
               f"{int(left_out.sum())} rows)." if len(left_out) else "") + "\n\n" + "\n".join(sections)
            + "\n" + agreement_section(table, shipped) + "\n" + deviceless_check() + "\n" + h200_measured_check())
    Path(args.out).write_text(text)
    CONSTANTS_FILE.write_text(json.dumps(CONSTANTS, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
