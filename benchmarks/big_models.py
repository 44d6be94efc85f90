"""Every command after ``tbs profile`` on real-size models: does each one finish, and how long does it take?

Models (models/build.py, random weights, no download): ``resnet50`` and ``efficientnet_b0``
(keras.applications, weights=None, 224x224), ``bert_base`` (a 12-block, 768-wide encoder of Keras
layers at 128 tokens) and ``ic_dr`` (InceptionV3 at 256x256). For each, one process per step:

1. ``tbs profile`` on the CPU at two small batches with short statistics (``--min-samples 3
   --max-cell-seconds 0.2 --min-span-seconds 0 --min-block-ms 2``; these are smoke-test numbers,
   not ones to quote), priced cpu=0.2;
2. ``tbs predict --device a100-40gb,t4`` (two predicted GPUs with no copy timed between them);
3. ``tbs recommend`` without ``--batch`` (the largest batch with a time for every layer);
4. ``tbs recommend --include-predicted`` at the larger batch, minimising cost and then time, the
   first with ``--cost t4=0.53`` (a price for a predicted device by its catalog id);
5. ``tbs recommend --verify`` (the placement run for real);
6. ``tbs report -o report.html``.

It prints one line per step (exit code, wall time, the output's first or error line) and writes
the table with ``--out``:

    python benchmarks/big_models.py --out benchmarks/big_models.md
    python benchmarks/big_models.py resnet50 --batch 1,32     # one model, the issue's batches
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet50", "efficientnet_b0", "bert_base", "ic_dr")
SHORT = ["--min-samples", "3", "--max-cell-seconds", "0.2", "--min-span-seconds", "0", "--min-block-ms", "2"]


def steps(model: Path, directory: Path, batches: str) -> list[tuple[str, list[str]]]:
    """(name, tbs arguments) in the order they run."""
    largest = batches.split(",")[-1]
    d = str(directory)
    return [
        ("profile", ["profile", str(model), "--out", d, "--batch", batches, "--cost", "cpu=0.2", *SHORT]),
        ("predict a100-40gb,t4", ["predict", d, "--device", "a100-40gb,t4"]),
        ("recommend (no --batch)", ["recommend", d]),
        (f"recommend --include-predicted --batch {largest} --cost t4=0.53",
         ["recommend", d, "--include-predicted", "--batch", largest, "--cost", "t4=0.53"]),
        (f"recommend --include-predicted --batch {largest} --objective time",
         ["recommend", d, "--include-predicted", "--batch", largest, "--objective", "time"]),
        ("recommend --verify", ["recommend", d, "--verify"]),
        ("report -o report.html", ["report", d, "-o", str(directory / "report.html")]),
    ]


def gist(step: str, rc: int, output: str) -> str:
    """The line that says what a step did: its error, the placement's head and total, or the last line."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    if rc != 0:
        return next((l for l in reversed(lines) if l.startswith(("Error", "ValueError", "TypeError"))),
                    lines[-1] if lines else "")
    if step.startswith("recommend"):
        head = next((l for l in lines if l.startswith("Placement for batch")), "")
        chosen = next((l for l in lines if l.startswith("recommended")), "")
        verdict = next((l for l in lines if "Verdict" in l or "verdict" in l), "")
        notes = [l for l in lines if l.startswith("Note: batch")]
        return "; ".join(x for x in (head.split(";")[0], " ".join(chosen.split()), verdict, *notes) if x)
    if step == "profile":
        return next((l for l in lines if l.startswith("Profile saved")), lines[-1] if lines else "")
    if step.startswith("report"):
        return "report.html written" if "report.html" in output or not lines else lines[-1]
    return lines[-1] if lines else ""


def run_model(name: str, batches: str, work: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import build_example

    started = time.perf_counter()
    model = build_example(name, work)
    rows = [dict(model=name, step="build (models/build.py)", rc=0, wall_s=time.perf_counter() - started,
                 gist=f"{model.stat().st_size / 1e6:.0f} MB")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for step, args in steps(model, work / name, batches):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tbs", *args], capture_output=True, text=True, env=env)
        row = dict(model=name, step=step, rc=done.returncode, wall_s=time.perf_counter() - started,
                   gist=gist(step, done.returncode, done.stdout + "\n" + done.stderr))
        print(f"{name:16} {step:60} rc={row['rc']} {row['wall_s']:7.1f} s  {row['gist'][:160]}", flush=True)
        rows.append(row)
        if step == "profile" and done.returncode != 0:
            break
    model.unlink()  # 20-440 MB each
    return rows


def table(rows: list[dict], batches: str, started: str, elapsed_s: float) -> str:
    from tbs.backends.host import host_info

    host = host_info()
    lines = [f"Measured {started} on {host['cpu_model']} ({host['cpu_count']} cores, shared with other work), "
             f"TensorFlow, CPU, batches {batches}, short statistics ({' '.join(SHORT)}); "
             f"`python benchmarks/big_models.py --out benchmarks/big_models.md`; {elapsed_s / 60:.0f} min in all.", "",
             "| model | step | exit | wall | what it said |", "|---|---|---:|---:|---|"]
    for r in rows:
        said = r["gist"].replace("|", "\\|")
        lines.append(f"| {r['model']} | `{r['step']}` | {r['rc']} | {r['wall_s']:.1f} s | {said} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS), help=f"default: {', '.join(MODELS)}")
    parser.add_argument("--batch", default="1,8", help="two small batch sizes (default 1,8)")
    parser.add_argument("--out", type=Path, help="write the table here (markdown)")
    parser.add_argument("--keep", type=Path, help="keep the profiles in this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    started, clock = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            rows += run_model(name, args.batch, work)
    text = table(rows, args.batch, started, time.perf_counter() - clock)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
