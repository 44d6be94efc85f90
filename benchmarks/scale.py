"""What profiling a real-size model costs, and what measuring identical layers once changes.

Cases (CPU, TensorFlow, default statistics, one process each):

- ``efficientnet-training``: keras.applications.EfficientNetB0 (weights=None, 224x224, 241 leaf
  layers), ``--training`` at batch 4 and 16;
- ``ic_dr``: InceptionV3 (models/build.py ic_dr, 313 leaf layers), inference at batch 8 and 32;
- ``transformer``: a 12-block BERT-style encoder from keras_hub (random weights), inference at two
  batch sizes, its inputs 128 tokens long, the model's own maximum (needs keras-hub: ``pip install
  --no-deps keras-hub && pip install regex rich tokenizers sentencepiece kagglehub`` keeps pip from
  swapping TensorFlow for the version tensorflow-text pins, which a model built from a config never uses;
  its token inputs have no declared length, so without ``--input`` tbs would make 16-token ones);
  ``transformer-seq16`` is the same model on those 16-token synthetic inputs;
- ``resnet50``: keras.applications.ResNet50 (weights=None, 224x224, 176 leaf layers), inference,
  one profile per batch size (32 and 256) with short sample settings: at 256 one eager capture
  would hold 35 GiB of activations, so the batch is measured in parts (docs/measuring.md).

For each: the wall time, the profile process's peak memory (RSS), the time inside timed samples,
the tool's overhead (wall ÷ timed), Σ layers against the whole model (or train step), how many rows share a representative's
measurement (``shared_with``), and how many cells are noisy. With ``--full`` the same profile is
taken again with ``--no-dedupe`` and each shared row is compared with its own measurement there:
the ratio, and whether it falls inside the full run's 95% CI.

    python benchmarks/scale.py efficientnet-training --full --out benchmarks/scale.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = Path(__file__).resolve().parent / "rows"
CASES = {
    "efficientnet-training": dict(batches="4,16", training=True),
    "ic_dr": dict(batches="8,32", training=False),
    "transformer": dict(batches="8,32", training=False, sequence=128),
    "transformer-seq16": dict(batches="8,32", training=False),
    "resnet50": dict(batches="32,256", training=False, each_batch=True,
                     extra=["--min-samples", "3", "--max-cell-seconds", "0.2", "--min-span-seconds", "0",
                            "--min-block-ms", "2"]),
}
APPLICATIONS = {"efficientnet-training": "EfficientNetB0", "resnet50": "ResNet50"}


BERT = ("keras_hub.models.BertBackbone(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768, "
        "intermediate_dim=3072, max_sequence_length=128)")


def build(case: str, directory: Path) -> Path:
    """The case's model file, built from code with random weights (no download)."""
    if case == "ic_dr":
        return _build_example("ic_dr", directory)
    transformer = case.startswith("transformer")
    path = directory / ("transformer.keras" if transformer else f"{case}.keras")
    if not path.exists():
        code = BERT if transformer else f"keras.applications.{APPLICATIONS[case]}(weights=None)"
        script = (f"import keras{', keras_hub' if transformer else ''}\n"
                  f"model = {code}\n"
                  f"model.save({str(path)!r})\n")
        subprocess.run([sys.executable, "-c", script], check=True)
    return path


def token_inputs(directory: Path, sequence: int, samples: int = 8) -> Path:
    """BERT's three inputs for ``samples`` sequences of ``sequence`` tokens (random ids, one segment, no padding)."""
    import numpy as np

    path = directory / f"tokens-{sequence}.npz"
    ids = np.random.default_rng(0).integers(0, 30522, (samples, sequence), dtype=np.int32)
    np.savez(path, token_ids=ids, segment_ids=np.zeros_like(ids), padding_mask=np.ones_like(ids))
    return path


def _build_example(name: str, directory: Path) -> Path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import build_example

    return build_example(name, directory)


def profile(model: Path, out: Path, batches: str, training: bool, extra: list[str]) -> dict:
    """One ``tbs profile`` in its own process; its wall time and what the profile says about itself."""
    command = [sys.executable, "-m", "tbs", "profile", str(model), "--out", str(out), "--batch", batches,
               *(["--training"] if training else []), *extra]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this process's own peak RSS (ru_maxrss: KiB on Linux)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, command)
    import pandas as pd

    summary, model_rows = pd.read_csv(out / "summary.csv"), pd.read_csv(out / "model.csv")
    samples = pd.read_csv(out / "samples.csv")
    timed = float(samples["raw_seconds"].sum())
    return dict(wall_s=wall, peak_rss_bytes=usage.ru_maxrss * 1024, timed_s=timed, overhead=wall / timed,
                rows=len(summary), statuses=summary["status"].value_counts().to_dict(),
                shared=int(summary["shared_with"].notna().sum()), noisy=int((summary["status"] == "noisy").sum()),
                sum_ratio={int(r.batch_size): float(r.layers_sum_s / r.median_s) for r in model_rows.itertuples()},
                directory=str(out))


def compare(deduped: Path, full: Path) -> dict:
    """Each shared row against the same layer measured on its own (the --no-dedupe run)."""
    import numpy as np
    import pandas as pd

    a, b = pd.read_csv(deduped / "summary.csv"), pd.read_csv(full / "summary.csv")
    keys = ["layer", "device", "batch_size"]
    both = a[a["shared_with"].notna()].merge(b, on=keys, suffixes=("", "_full"))
    ratio = both["median_s"] / both["median_s_full"]
    inside = (both["median_s"] >= both["ci_low_s_full"]) & (both["median_s"] <= both["ci_high_s_full"])
    # The same comparison for rows measured in both runs: the machine's own run-to-run spread.
    alone = a[a["shared_with"].isna()].merge(b, on=keys, suffixes=("", "_full"))
    spread = alone["median_s"] / alone["median_s_full"]
    return dict(shared=len(both), median_abs_log_ratio=float(np.median(np.abs(np.log(ratio)))),
                p90_abs_log_ratio=float(np.percentile(np.abs(np.log(ratio)), 90)),
                inside_full_ci=float(inside.mean()),
                measured_both_median_abs_log_ratio=float(np.median(np.abs(np.log(spread)))),
                measured_both_p90_abs_log_ratio=float(np.percentile(np.abs(np.log(spread)), 90)))


def table(results: dict[str, dict]) -> str:
    from tbs.backends.host import host_info

    host = host_info()
    lines = [f"Measured {dt.date.today().isoformat()} on {host['cpu_model']} ({host['cpu_count']} cores), "
             "TensorFlow, CPU, default statistics; `python benchmarks/scale.py CASE --full`.", "",
             "| case | batches | run | wall | peak RSS | timed | overhead (wall ÷ timed) | rows | shared | noisy "
             "| Σ / whole |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for case, r in results.items():
        for run in [k for k in r if k in ("dedupe", "full") or k.startswith("batch ")]:
            x = r[run]
            peak = f"{x['peak_rss_bytes'] / 2**30:.1f} GiB" if x.get("peak_rss_bytes") else ""
            ratios = ", ".join(f"{b}: {v:.2f}" for b, v in x["sum_ratio"].items())
            label = {"dedupe": "identical layers once", "full": "--no-dedupe"}.get(run, f"{run} alone")
            label += ' (earlier run)' if x.get('earlier') else ''
            lines.append(f"| {case} | {r['batches']} | {label} "
                         f"| {x['wall_s'] / 60:.1f} min | {peak} | {x['timed_s'] / 60:.1f} min | {x['overhead']:.2f}x "
                         f"| {x['rows']} | {x['shared']} | {x['noisy']} | {ratios} |")
    lines += ["", "Shared rows against the same layers measured on their own (the --no-dedupe run), and, for the "
              "machine's own spread, the rows measured in both runs:", "",
              "| case | shared rows | median / p90 \\|log ratio\\| | inside the full run's 95% CI "
              "| rows measured in both: median / p90 \\|log ratio\\| |", "|---|---:|---:|---:|---:|"]
    for case, r in results.items():
        c = r.get("compare")
        if c:
            lines.append(f"| {case} | {c['shared']} | {c['median_abs_log_ratio']:.1%} / {c['p90_abs_log_ratio']:.1%} "
                         f"| {c['inside_full_ci']:.0%} | {c['measured_both_median_abs_log_ratio']:.1%} / "
                         f"{c['measured_both_p90_abs_log_ratio']:.1%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"the cases to run, of {', '.join(CASES)} (default: all)")
    parser.add_argument("--full", action="store_true", help="also profile with --no-dedupe and compare")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    parser.add_argument("--reuse", action="store_true", help="re-render the saved rows instead of measuring")
    parser.add_argument("--keep", type=Path, default=None, help="keep the profiles in this directory")
    parser.add_argument("--batch", default=None, help="batch sizes instead of the case's own")
    args = parser.parse_args()
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:  # checked here: argparse's choices refuse an empty list of positionals on Python 3.11
        parser.error(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    saved = ROWS / "scale.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    if not args.reuse:
        root = args.keep or Path(tempfile.mkdtemp(prefix="tbs-scale-"))
        root.mkdir(parents=True, exist_ok=True)
        try:
            for case in args.cases or list(CASES):
                model = build(case, root)
                spec = dict(CASES[case], **({"batches": args.batch} if args.batch else {}))
                data = (["--input", str(token_inputs(root, spec["sequence"]))] if "sequence" in spec else [])
                earlier = results.get(case, {})  # without --full, the last --no-dedupe run stays, marked earlier
                r = {"batches": spec["batches"], **{k: dict(earlier[k], earlier=True) for k in ("full", "compare")
                                                    if k in earlier and not args.full}}
                data += spec.get("extra", [])
                if spec.get("each_batch"):  # one process per batch size: each its own time and peak memory
                    for batch in spec["batches"].split(","):
                        r[f"batch {batch}"] = profile(model, root / f"{case}-{batch}", batch, spec["training"], data)
                else:
                    r["dedupe"] = profile(model, root / f"{case}-dedupe", spec["batches"], spec["training"], data)
                if args.full:
                    r["full"] = profile(model, root / f"{case}-full", spec["batches"], spec["training"],
                                        ["--no-dedupe", *data])
                    r["compare"] = compare(root / f"{case}-dedupe", root / f"{case}-full")
                results[case] = r
                print(json.dumps({case: r}), file=sys.stderr)
                ROWS.mkdir(exist_ok=True)
                saved.write_text(json.dumps(results, indent=1))
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
    text = table(results)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
