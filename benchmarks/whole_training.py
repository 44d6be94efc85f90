"""Whole-model GPU predictions of one training step against published single-GPU training throughput.

For every row of tbs/predictions/reference/whole_training.csv (NVIDIA DeepLearningExamples' training tables, 1 GPU),
the model is rebuilt in Keras (benchmarks/whole_models.py), one train step compiled for this CPU as a TensorFlow
training profile's model cell compiles it (tbs.backends.tensorflow.training.train_step: forward with training=True,
the loss, every trainable variable's gradient and the optimizer's update in one XLA program), its kernels read and
priced on the published GPU at the published precision with the SHIPPED whole-model constants and band
(tbs.predictions.whole, fitted on inference latencies only). The published seconds per step are batch /
throughput. Nothing is fitted here unless --refit: then one training constant (a factor on the prediction) is
fitted held out by model (each non-classifier model scored with the factor fitted on the other; ResNet-50 never
fitted on) and reported beside the shipped scores. A last section scores the train steps XLA:GPU itself compiles
for each row's GPU at the row's batch (benchmarks/gpu_programs.py --train, compiled without a GPU), priced with
the constants whole_model.py fitted on XLA:GPU's inference programs (benchmarks/rows/whole_model_constants.json).

Usage: python benchmarks/whole_training.py [--fill] [--out benchmarks/whole_training.md]   (about 4 minutes on 2
cores once the kernel cache, $TBS_WHOLE_TRAIN_CACHE or /tmp/tbs_whole_train_kernels, is filled; --fill compiles what
it lacks first: each model and precision at batch 1 and 2 plus the four checks, 14 CPU compiles, about 35 minutes,
BERT-large's train step 1-5 minutes each)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_programs  # noqa: E402
import whole_models  # noqa: E402
import whole_train_steps  # noqa: E402
from whole_model import CONSTANTS_FILE, markdown, specs, summary  # noqa: E402

from tbs.predictions.reference import fitted_model  # noqa: E402
from tbs.predictions.whole import BAND_PERCENT, WHOLE_BAND, predict_whole  # noqa: E402

TABLE = HERE.parent / "tbs" / "predictions" / "reference" / "whole_training.csv"
UPDATE_PREFIXES = ("adam", "adam_w", "adamw", "sgd", "loss_scale_optimizer")  # the optimizer's name scope in the step
# Compiled beside the extrapolation from batch 1 and 2, to check it.
CHECKS = (("resnet50", None, 8, True), ("unet_medical", None, 4, True), ("bert_large", 384, 4, True),
          ("bert_large", 384, 8, True))


def sequence_of(row) -> int | None:
    return int(row.sequence_length) if row.sequence_length == row.sequence_length else None


def phase_of(op: str) -> str:
    """Which part of the step a kernel's op belongs to (its name scope; '' where XLA's fusion kept no name)."""
    head = re.sub(r"_\d+$", "", op.split("/")[0].lower())  # adam_w_1: the optimizer's scope in a second model
    if head in UPDATE_PREFIXES:
        return "update"
    return "backward" if head == "gradient_tape" else ("unnamed" if not head else "forward and loss")


def banded(out: pd.DataFrame, low: float, high: float) -> pd.DataFrame:
    """``out`` with each row's band (``low`` and ``high`` times its prediction), error and whether the band holds
    the published step."""
    out["low_s"], out["high_s"] = out["predicted_s"] * low, out["predicted_s"] * high
    out["log_error"] = np.log(out["predicted_s"] / out["step_s"])
    out["covered"] = (out["step_s"] >= out["low_s"]) & (out["step_s"] <= out["high_s"])
    return out


def score(table: pd.DataFrame, loss_scale: bool = False) -> pd.DataFrame:
    """Each row's predicted step (shipped constants), its band, and the update kernels' share of it."""
    found, model = specs(), fitted_model()
    out = table.copy()
    predicted, update, inference, memory = [], [], [], []
    for row in table.itertuples():
        half = row.precision == "fp16"
        kernels = whole_train_steps.train_kernels(row.model, sequence_of(row), int(row.batch_size), half, loss_scale)
        step = predict_whole(kernels, found[row.device], row.precision, model)
        predicted.append(step.seconds)
        memory.append(sum(s for k, s in zip(step.kernels, step.kernel_seconds) if k["kind"] == "memory"))
        update.append(sum(s for k, s in zip(step.kernels, step.kernel_seconds) if phase_of(str(k.get("op", ""))) == "update"))
        forward = whole_models.kernels(row.model, sequence_of(row), int(row.batch_size), half) \
            if whole_models.cached(row.model, sequence_of(row), half) else None
        inference.append(predict_whole(forward, found[row.device], row.precision, model).seconds if forward else np.nan)
    out["predicted_s"] = predicted
    out["update_s"] = update
    out["memory_s"] = memory
    out["inference_predicted_s"] = inference
    return banded(out, *WHOLE_BAND)


def gpu_program_constants(table: pd.DataFrame) -> dict | None:
    """The constants whole_model.py fitted on XLA:GPU's inference programs, where they are fitted and every row's
    train step is compiled for its GPU (benchmarks/gpu_programs.py --train); else None."""
    constants = json.loads(CONSTANTS_FILE.read_text()).get("gpu") if CONSTANTS_FILE.exists() else None
    compiled = all(gpu_programs.program_path(r.device, r.model, sequence_of(r), int(r.batch_size),
                                             r.precision == "fp16", training=True).exists() for r in table.itertuples())
    return constants if compiled else None


def score_gpu_programs(table: pd.DataFrame, constants: dict) -> pd.DataFrame:
    """Each row's step from XLA:GPU's own train-step program, compiled for the row's GPU at the row's batch (no
    extrapolation), priced with the constants whole_model.py fitted on XLA:GPU's inference programs, and their
    band (nothing fitted on training)."""
    found, model = specs(), fitted_model()
    out = table.copy()
    predicted, memory = [], []
    for row in table.itertuples():
        kernels = gpu_programs.gpu_kernels(row.device, row.model, sequence_of(row), int(row.batch_size),
                                           row.precision == "fp16", training=True)
        step = predict_whole(kernels, found[row.device], row.precision, model, constants["host_overhead_s"],
                             fold_epilogues=False, kernel_s=constants["kernel_s"],
                             sustained_clock=constants["sustained_clock"],
                             tf32_efficiency=constants["tf32_efficiency"])
        predicted.append(step.seconds)
        memory.append(sum(s for k, s in zip(step.kernels, step.kernel_seconds) if k["kind"] == "memory"))
    out["predicted_s"], out["memory_s"] = predicted, memory
    return banded(out, *constants["band"])


def gpu_programs_section(table: pd.DataFrame) -> str:
    """The train steps as XLA:GPU compiles them for each row's GPU, scored beside the shipped prediction."""
    title = "## XLA:GPU's own train step (compiled for each row's GPU at its batch, without one)\n\n"
    constants = gpu_program_constants(table)
    if constants is None:
        return title + "Not scored: not every row's train step is compiled for its GPU (benchmarks/gpu_programs.py " \
                       "--train), or whole_model.py has not fitted its constants.\n"
    scored = score_gpu_programs(table, constants)
    scored.to_csv(HERE / "rows" / "whole_training-gpu-programs.csv", index=False)
    fitted, classifiers = scored[~scored["classifier"]], scored[scored["classifier"]]
    return (title + f"Priced with the constants fitted on XLA:GPU's inference programs (whole_model.py's last "
            f"section) and their band x{constants['band'][0]:.2f}-x{constants['band'][1]:.2f}; nothing fitted on "
            f"training. Per GPU, non-classifier models:\n\n{markdown(summary(fitted, ['device']))}\n"
            f"Per model, GPU and precision:\n\n{markdown(summary(fitted, ['model', 'device', 'precision']))}\n"
            f"Independent check, ResNet-50:\n\n{markdown(summary(classifiers, ['model', 'device', 'precision']))}\n"
            f"Every row (memory passes' share as above):\n\n{markdown(program_rows(scored))}\n")


def program_rows(scored: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"model": scored["model"], "device": scored["device"], "precision": scored["precision"],
                         "batch": scored["batch_size"], "published ms": (scored["step_s"] * 1e3).round(1),
                         "predicted ms": (scored["predicted_s"] * 1e3).round(1),
                         "predicted / published": np.exp(scored["log_error"]).round(2),
                         "inside": scored["covered"].map({True: "yes", False: "no"}),
                         "memory passes' share": (scored["memory_s"] / scored["predicted_s"]).map("{:.0%}".format)})


def held_out_factor(scored: pd.DataFrame) -> pd.DataFrame:
    """One factor on the training prediction, fitted held out by model: each non-classifier model's rows scored
    with the median published/predicted of the other non-classifier models' rows; classifiers with every other's."""
    out = scored.copy()
    fitted = ~out["classifier"].to_numpy(bool)
    ratio = np.log(out["step_s"] / out["predicted_s"]).to_numpy()
    factor = np.zeros(len(out))
    for name in out["model"].unique():
        rows = (out["model"] == name).to_numpy()
        factor[rows] = np.exp(np.median(ratio[fitted & ~rows]))
    out["factor"] = factor
    out["predicted_s"] = out["predicted_s"] * factor
    return banded(out, *WHOLE_BAND)


def extrapolation_check() -> pd.DataFrame:
    """The step predicted from batch 1 and 2 extrapolated against the step compiled at a larger batch."""
    found, model, rows = specs(), fitted_model(), []
    for name, sequence, batch, half in CHECKS:
        if not whole_train_steps.train_path(name, sequence, batch, half, False).exists():
            continue
        one, two = (whole_train_steps.compiled_train_kernels(name, sequence, b, half) for b in (1, 2))
        grown = whole_train_steps.aligned(one, two, batch)
        compiled = whole_train_steps.compiled_train_kernels(name, sequence, batch, half)
        for device in ("v100", "a100-80gb"):
            precision = "fp16" if half else "fp32"
            a, b = (predict_whole(k, found[device], precision, model).seconds if k else np.nan for k in (grown, compiled))
            rows.append({"model": name, "batch": batch, "precision": precision, "device": device,
                         "kernels (extrapolated / compiled)": f"{len(grown) if grown else '-'} / {len(compiled)}",
                         "extrapolated ms": f"{a * 1e3:.2f}", "compiled ms": f"{b * 1e3:.2f}",
                         "gap": f"{a / b - 1:+.1%}"})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "whole_training.md"))
    parser.add_argument("--fill", action="store_true", help="compile the train steps the cache lacks first")
    args = parser.parse_args()
    table = pd.read_csv(TABLE)
    if args.fill:
        configs = table[["model", "sequence_length", "precision"]].drop_duplicates()
        wanted = {(r.model, sequence_of(r), b, r.precision == "fp16") for r in configs.itertuples() for b in (1, 2)}
        for name, sequence, batch, half in sorted(wanted, key=str) + list(CHECKS):
            whole_train_steps.compiled_train_kernels(name, sequence, batch, half)
    ready = np.array([whole_train_steps.train_cached(r.model, sequence_of(r), r.precision == "fp16")
                      for r in table.itertuples()])
    left_out = table[~ready].groupby(["model", "precision"]).size()
    scored = score(table[ready].reset_index(drop=True))
    scored.to_csv(HERE / "rows" / "whole_training.csv", index=False)
    fitted, classifiers = scored[~scored["classifier"]], scored[scored["classifier"]]
    refit = held_out_factor(scored)
    text = (f"# Whole-model GPU predictions of a training step against published training throughput\n\n"
            f"`python benchmarks/whole_training.py`: {len(scored)} single-GPU rows of {TABLE.name} (NVIDIA "
            f"DeepLearningExamples' training tables; each row's licence in its `license` column). Published seconds "
            f"per step = batch / throughput. Predicted: one train step's compiled program (tbs's TensorFlow train "
            f"step, the optimizer closest to the published one) priced with the shipped whole-model constants and "
            f"{BAND_PERCENT}% band x{WHOLE_BAND[0]:.2f}-x{WHOLE_BAND[1]:.2f} (fitted on inference latencies only). "
            f"Errors are |log(predicted / published)| shown as a factor - 1."
            + (f" Not scored (not compiled here: {', '.join(f'{m} {p}' for m, p in left_out.index)}, "
               f"{int(left_out.sum())} rows)." if len(left_out) else "") + "\n\n"
            f"## Shipped constants\n\nPer GPU, non-classifier models ({fitted['covered'].mean():.0%} of "
            f"{len(fitted)} inside the band):\n\n{markdown(summary(fitted, ['device']))}\n"
            f"Per model, GPU and precision:\n\n{markdown(summary(fitted, ['model', 'device', 'precision']))}\n"
            f"Independent check, ResNet-50 (never fitted on):\n\n"
            f"{markdown(summary(classifiers, ['model', 'device', 'precision']))}\n"
            f"Every row (update share: the optimizer's kernels' share of the predicted step; memory passes' share: "
            f"the kernels that are not convolutions or GEMMs; train / inference: the predicted step over the predicted "
            f"forward (whole_model.py's program) at the same batch):\n\n{markdown(rows_table(scored))}\n"
            f"## Extrapolation check\n\nBatch 1 and 2 compiled, larger batches extrapolated kernel by kernel; "
            f"against the step compiled at a larger batch:\n\n{markdown(extrapolation_check())}\n"
            f"## One training factor, held out by model (not shipped)\n\n"
            + "; ".join(f"{m}: x{g['factor'].iloc[0]:.2f}" for m, g in refit.groupby("model")) + "\n\n"
            f"{markdown(summary(refit[~refit['classifier']], ['device']))}\n"
            f"ResNet-50 with the factor fitted on BERT and U-Net:\n\n"
            f"{markdown(summary(refit[refit['classifier']], ['device']))}\n\n"
            + gpu_programs_section(table))
    Path(args.out).write_text(text)
    print(text)


def rows_table(scored: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"model": scored["model"], "device": scored["device"], "precision": scored["precision"],
                         "batch": scored["batch_size"], "framework": scored["framework"].str.split(",").str[0],
                         "published ms": (scored["step_s"] * 1e3).round(1),
                         "predicted ms": (scored["predicted_s"] * 1e3).round(1),
                         "predicted / published": np.exp(scored["log_error"]).round(2),
                         "inside": scored["covered"].map({True: "yes", False: "no"}),
                         "update share": (scored["update_s"] / scored["predicted_s"]).map("{:.0%}".format),
                         "memory passes' share": (scored["memory_s"] / scored["predicted_s"]).map("{:.0%}".format),
                         "train / inference predicted": (scored["predicted_s"] / scored["inference_predicted_s"]).round(2)})


if __name__ == "__main__":
    main()
