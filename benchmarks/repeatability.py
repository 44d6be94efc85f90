"""Repeatability: profile the same model twice; how many run-2 medians fall in run 1's CI?

    python benchmarks/repeatability.py --models cnn_flowers,rnn_mnist --batch 32

The CI is the 95% order-statistic CI of each cell's median; on a quiet machine most
cells of a second run should land inside it. Noise between runs (another tenant, CPU
frequency) is exactly what this shows.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from common import build_example, profile_once



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn_flowers,rnn_mnist,lstm_sunspots")
    parser.add_argument("--batch", default="32")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tbs-repeat-"))
    lines = ["| model | batch | cells | run 2 median inside run 1 CI | median |run 2 − run 1| / run 1 |",
             "|---|---:|---:|---:|---:|"]
    try:
        for name in args.models.split(","):
            model_path = build_example(name, work)
            first = profile_once(model_path, batches, work / f"{name}-1").summary
            second = profile_once(model_path, batches, work / f"{name}-2").summary
            both = first.merge(second, on=["layer", "device", "batch_size"], suffixes=("_1", "_2"))
            for batch, cells in both.groupby("batch_size"):
                inside = ((cells["median_s_2"] >= cells["ci_low_s_1"]) & (cells["median_s_2"] <= cells["ci_high_s_1"]))
                change = ((cells["median_s_2"] - cells["median_s_1"]).abs() / cells["median_s_1"]).median()
                lines.append(f"| {name} | {batch} | {len(cells)} | {inside.sum()} ({inside.mean():.0%}) | {change:.1%} |")
                print(lines[-1], file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
