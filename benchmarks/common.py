"""What the benchmark scripts share: building an example model and profiling it through the Python API."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tbs  # noqa: E402


def build_example(name: str, directory: Path) -> Path:
    """Build models/build.py's NAME into directory; returns the model file."""
    spec = importlib.util.spec_from_file_location("example_models", ROOT / "models" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build(name, directory))


def profile_once(model_path: Path, batches: list[int], directory: Path, backend: str = "tensorflow",
                 timing: tbs.TimingConfig | None = None, training: bool = False) -> tbs.Profile:
    """One profile (inference, or training) on the first CPU with the default statistics, written to directory."""
    return tbs.profile(model_path, batches, devices=["cpu:0"], backend=backend, out=directory,
                       timing=timing, progress=None, report=False, training=training)


def markdown(frame: "pd.DataFrame") -> str:
    """A DataFrame as a Markdown table (pandas' to_markdown needs tabulate, which tbs does not install)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    return header + "".join("| " + " | ".join("" if v is None or v != v else str(v) for v in row) + " |\n"
                            for row in frame.itertuples(index=False))


def tool_overhead(profile: tbs.Profile) -> float | None:
    """Wall time of the run over the time spent inside timed samples (1.0 would be no overhead at all)."""
    sampled_s = float(profile.samples["raw_seconds"].sum()) if not profile.samples.empty else 0.0
    elapsed_s = profile.metadata.get("elapsed_s")
    return None if not sampled_s or not elapsed_s else float(elapsed_s) / sampled_s
