#!/usr/bin/env python3
"""Build tbs/predictions/reference/whole_models.csv: published whole-model GPU inference latencies.

Source (a read-only git mirror, obtained with the `fetch` tool): NVIDIA DeepLearningExamples,
https://github.com/NVIDIA/DeepLearningExamples (each model folder's licence: Apache-2.0, U-Net
Medical's LICENSE BSD-3-Clause). Only numbers are carried over (facts);
the README tables are read as text here, no code of the source is used.

Each row: one model configuration, GPU, precision and batch size, with the published 90th-percentile
latency of one batch (every table used gives it; the averages include the first, slow steps). The
image classifiers' rows (ResNet-50) are the independent check: never fitted on.

Usage: python build_whole_models.py [--repo DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
DEFAULT_REPO = "/work/.mirror/NVIDIA+DeepLearningExamples/repo"
DEFAULT_OUT = HERE.parent.parent / "tbs" / "predictions" / "reference" / "whole_models.csv"
# Each model folder's own licence (the repository has none at its root).
LICENSES = {"TensorFlow/LanguageModeling/BERT/README.md": "Apache-2.0 (the folder's LICENSE and NOTICE)",
            "TensorFlow2/Segmentation/UNet_Medical/README.md":
                "BSD-3-Clause (the folder's LICENSE, NVIDIA 2018; its NOTICE names Apache-2.0, NVIDIA 2021)",
            "TensorFlow/Classification/ConvNets/resnet50v1.5/README.md": "Apache-2.0 (ConvNets/LICENSE)",
            "TensorFlow2/LanguageModeling/BERT/README.md":
                "Apache-2.0 (the folder's scripts' headers, NVIDIA 2021; the folder has no LICENSE file)"}
# (README path, model family, framework as the README names its container, the tables' harness)
SOURCES = [
    ("TensorFlow/LanguageModeling/BERT/README.md", "bert", "TensorFlow 20.06 (TF1), XLA on",
     "scripts/finetune_inference_benchmark.sh (SQuAD v1.1 fine-tuned model)"),
    ("TensorFlow2/Segmentation/UNet_Medical/README.md", "unet_medical", "TensorFlow 21.02 (TF2)",
     "examples/unet_INFER_BENCHMARK{_TF-AMP}.sh"),
    ("TensorFlow/Classification/ConvNets/resnet50v1.5/README.md", "resnet50", "TensorFlow 20.06 (TF1)",
     "inference_benchmark.sh"),
    ("TensorFlow2/LanguageModeling/BERT/README.md", "bert", "TensorFlow 21.02 (TF2), XLA on",
     "scripts/finetune_inference_benchmark.sh (run_inference_benchmark*.sh with use_xla true)"),
]
CLASSIFIERS = ("resnet50",)
GPUS = (("A100 80G", "a100-80gb"), ("A100 40G", "a100-40gb"), ("T4", "t4"), ("V100", "v100"))
PRECISIONS = (("mixed precision", "fp16"), ("fp16", "fp16"), ("tf32", "tf32"), ("fp32", "fp32"))
COLUMNS = ["model", "family", "classifier", "sequence_length", "resolution", "device", "precision", "xla",
           "batch_size", "latency_s", "statistic", "framework", "harness", "table", "source", "source_path",
           "commit", "license"]


def _gpu(heading: str) -> str | None:
    return next((gpu for name, gpu in GPUS if name.lower() in heading.lower()), None)


def _precision(label: str) -> str | None:
    return next((p for name, p in PRECISIONS if name in label.lower()), None)


def _cells(line: str) -> list[str]:
    return [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    found = re.search(r"[\d.]+", text.replace(",", "."))
    return float(found.group(0)) if found else None


def results_tables(text: str, section: str, prose_labels: bool = True
                   ) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(GPU heading, the subheading or line above the table, header, rows) for every table under the ``####``
    heading naming ``section``; with ``prose_labels`` a plain line above a table is its label too."""
    out, inside, heading, label = [], False, "", ""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        if line.startswith("#### "):
            inside = section in line.lower()
        elif line.startswith("##### ") and inside:
            heading, label = line.lstrip("#").strip(), ""
        elif inside and line.startswith("###### "):
            label = line.lstrip("#").strip()
        elif inside and line.startswith("|") and index + 1 < len(lines) and set(lines[index + 1].strip()) <= set("|:- "):
            header, rows = _cells(line), []
            index += 2
            while index < len(lines) and lines[index].strip().startswith("|"):
                rows.append(_cells(lines[index]))
                index += 1
            out.append((heading, label, header, rows))
            continue
        elif inside and line and prose_labels:
            label = line
        index += 1
    return out


def inference_tables(text: str) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """Every table under 'Inference performance results'."""
    return results_tables(text, "inference performance results")


def _column(header: list[str], *words: str) -> int | None:
    return next((i for i, h in enumerate(header) if all(w in h.lower() for w in words)), None)


def rows_of(path: str, family: str, framework: str, harness: str, text: str, commit: str) -> list[dict]:
    out = []
    for heading, label, header, rows in inference_tables(text):
        gpu = _gpu(heading)
        batch_at, latency_at = _column(header, "batch"), _column(header, "90%")
        precision_at = next((i for i, h in enumerate(header) if "precision" in h.lower() and "speedup" not in h.lower()),
                            None)  # not TF2 BERT's "Throughput speedup (FP32 to mixed precision)"
        sequence_at = _column(header, "sequence")
        model_at, resolution_at = _column(header, "model"), _column(header, "resolution")
        if gpu is None or batch_at is None or latency_at is None:
            continue
        for cells in rows:
            if len(cells) != len(header) or not cells[batch_at].strip():
                continue
            precision = _precision(cells[precision_at]) if precision_at is not None else _precision(label)
            latency_ms = _number(cells[latency_at])
            if precision is None or latency_ms is None:
                continue
            name = family if model_at is None else f"{family}_{cells[model_at]}"
            size = re.search(r"bert-?\s*(base|large)", label.lower()) if model_at is None else None
            name = f"{family}_{size.group(1)}" if size else name  # TF2 BERT: "BERT-Large FP16" above the table
            out.append({"model": name, "family": family, "classifier": family in CLASSIFIERS,
                        "sequence_length": int(cells[sequence_at]) if sequence_at is not None else "",
                        "resolution": cells[resolution_at] if resolution_at is not None else "",
                        "device": gpu, "precision": precision, "xla": "xla" in label.lower() or "XLA on" in framework,
                        "batch_size": int(_number(cells[batch_at])), "latency_s": latency_ms * 1e-3,
                        "statistic": "90th percentile latency of one batch", "framework": framework,
                        "harness": harness, "table": f"{heading} / {label}" if label else heading,
                        "source": "NVIDIA/DeepLearningExamples", "source_path": path, "commit": commit,
                        "license": LICENSES[path]})
    return out


def mirror(repo: str, *args: str) -> str:
    """A git command's output on the read-only mirror (``rev-parse HEAD``, ``show HEAD:path``)."""
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=DEFAULT_REPO)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    commit = mirror(args.repo, "rev-parse", "HEAD").strip()
    rows = []
    for path, family, framework, harness in SOURCES:
        rows += rows_of(path, family, framework, harness, mirror(args.repo, "show", f"HEAD:{path}"), commit)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.to_csv(args.out, index=False)
    print(frame.groupby(["model", "device", "precision"]).size().to_string())


if __name__ == "__main__":
    main()
