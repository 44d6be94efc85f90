#!/usr/bin/env python3
"""Build tbs/predictions/reference/whole_training.csv: published single-GPU whole-model training throughput.

Source: the same NVIDIA DeepLearningExamples mirror and READMEs as whole_models.csv (build_whole_models.py: its
licences, GPU and precision names). Only numbers are carried over (facts); the README tables are read as text.

Each row: one model, GPU, precision and batch size per GPU from a "Training performance" table's 1-GPU row, with
the published throughput (samples per second) and the seconds of one training step it implies (batch /
throughput). BERT: the SQuAD v1.1 fine-tuning tables only (BERT-large, 384 tokens: run_squad.sh's defaults; its
optimizer Adam with weight decay); the pre-training tables are left out (LAMB with gradient accumulation over
hundreds of micro-batches per update, and masked-LM and next-sentence heads the Keras rebuild does not have).
U-Net Medical: its TF2 tables (Adam; the benchmark scripts pass --xla). ResNet-50 v1.5: its TF1 tables (SGD with
momentum), the independent check, never fitted on.

Usage: python build_whole_training.py [--repo DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from build_whole_models import CLASSIFIERS, DEFAULT_REPO, LICENSES, _cells, _gpu, _number, _precision, mirror, results_tables

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "tbs" / "predictions" / "reference" / "whole_training.csv"
# (README path, model, sequence length, resolution, framework, harness, the optimizer the source states)
SOURCES = [
    ("TensorFlow/LanguageModeling/BERT/README.md", "bert_large", 384, "", "TensorFlow 20.06 (TF1), XLA on",
     "scripts/run_squad.sh (SQuAD v1.1 fine-tuning; defaults: BERT-large, 384 tokens, use_xla true)",
     "Adam with weight decay (AdamWeightDecayOptimizer, optimizer_type adam)"),
    ("TensorFlow2/LanguageModeling/BERT/README.md", "bert_large", 384, "", "TensorFlow 21.02 (TF2), XLA on",
     "scripts/run_squad.sh (SQuAD v1.1 fine-tuning; defaults: BERT-large, use_xla true; 384 tokens from the "
     "SQuAD preparation)", "Adam with weight decay (optimizer_type adam), dynamic loss scaling with AMP"),
    ("TensorFlow2/Segmentation/UNet_Medical/README.md", "unet_medical", "", "572x572x1", "TensorFlow 21.02 (TF2), XLA on",
     "examples/unet_TRAIN_BENCHMARK{_TF-AMP}.sh (--xla; --amp for mixed precision)",
     "Adam, dynamic loss scaling with AMP"),
    ("TensorFlow/Classification/ConvNets/resnet50v1.5/README.md", "resnet50", "", "224x224x3",
     "TensorFlow 20.06 (TF1), XLA on", "resnet50v1.5/training/training_perf.sh",
     "SGD with momentum 0.875, label smoothing 0.1"),
]
COLUMNS = ["model", "family", "classifier", "sequence_length", "resolution", "device", "precision", "xla",
           "batch_size", "throughput_per_s", "step_s", "optimizer", "statistic", "framework", "harness", "table",
           "source", "source_path", "commit", "license"]


def training_tables(text: str) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """Every table under 'Training performance results'."""
    return results_tables(text, "training performance results", prose_labels=False)


def batches(cell: str, header: str) -> dict[str, int]:
    """Batch size per precision from a batch cell: '4,2' (mixed precision first, as the header says),
    '128 (FP32) / 256 (AMP)', or one number for every precision."""
    tagged = re.findall(r"(\d+)\s*\((fp32|tf32|amp)\)", cell.lower())
    if tagged:
        return {"fp16" if tag == "amp" else tag: int(size) for size, tag in tagged}
    sizes = [int(s) for s in re.findall(r"\d+", cell)]
    if len(sizes) == 2 and "mixed precision," in header.lower():
        other = "tf32" if "tf32" in header.lower() else "fp32"
        return {"fp16": sizes[0], other: sizes[1]}
    return {"any": sizes[0]} if len(sizes) == 1 else {}


def rows_of(source: tuple, text: str, commit: str) -> list[dict]:
    path, model, sequence, resolution, framework, harness, optimizer = source
    out = []
    for heading, label, header, rows in training_tables(text):
        gpu, titles = _gpu(f"{label} {heading}"), f"{label} {heading}".lower()
        if gpu is None or "pre-training" in titles:
            continue
        gpus_at = next((i for i, h in enumerate(header) if h.lower() == "gpus"), None)
        batch_at = next((i for i, h in enumerate(header) if "batch size" in h.lower()), None)
        if gpus_at is None or batch_at is None:
            continue
        for cells in rows:
            if len(cells) != len(header) or cells[gpus_at] != "1":
                continue
            sizes = batches(cells[batch_at], header[batch_at])
            for at, name in enumerate(header):
                if not name.lower().startswith("throughput -"):
                    continue  # the speedup and scaling columns
                precision = _precision(name)
                if precision == "fp32" and gpu.startswith("a100") and "tf32" in header[batch_at].lower():
                    precision = "tf32"  # TF2 BERT's A100 table: "Batch size / GPU: mixed precision, TF32"
                batch, throughput = sizes.get(precision, sizes.get("any")), _number(cells[at])
                if precision is None or batch is None or throughput is None:
                    continue
                out.append({"model": model, "family": model.split("_")[0] if model.startswith("bert") else model,
                            "classifier": model in CLASSIFIERS, "sequence_length": sequence,
                            "resolution": resolution, "device": gpu, "precision": precision, "xla": True,
                            "batch_size": batch, "throughput_per_s": throughput, "step_s": batch / throughput,
                            "optimizer": optimizer, "statistic": "training throughput on 1 GPU (samples per second); "
                            "step_s = batch / throughput", "framework": framework, "harness": harness,
                            "table": f"{heading} / {label}" if label else heading,
                            "source": "NVIDIA/DeepLearningExamples", "source_path": path, "commit": commit,
                            "license": LICENSES[path]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=DEFAULT_REPO)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    commit = mirror(args.repo, "rev-parse", "HEAD").strip()
    rows = []
    for source in SOURCES:
        rows += rows_of(source, mirror(args.repo, "show", f"HEAD:{source[0]}"), commit)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.to_csv(args.out, index=False)
    print(frame[["model", "device", "precision", "batch_size", "throughput_per_s", "step_s", "framework"]].to_string())


if __name__ == "__main__":
    main()
