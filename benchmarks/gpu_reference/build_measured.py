"""tbs's own GPU profiles as reference rows: writes tbs/predictions/reference/measured.csv.

    python benchmarks/gpu_reference/build_measured.py     # seconds; then python -m tbs.predictions.reference

Every inference profile under profiles/<gpu>/ (a GPU id of the reference datasheets) gives its resolved GPU
layer cells (tbs.predictions.reference.measured says which are left out and why), each described by the CPU
analysis of the same layer and batch: the same profile's host CPU, else this machine's profile of the model
in profiles/cpu/. The precision is the one ``tbs predict`` assumes there (the catalog's: float32 matmuls as TF32).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tbs.predictions.catalog import load_catalog  # noqa: E402
from tbs.predictions.gpu_predict import precision_of  # noqa: E402
from tbs.predictions.reference import gpu_specs, measured  # noqa: E402
from tbs.profiles.profile import load_profile  # noqa: E402

PROFILES = ROOT / "profiles"
OUT = ROOT / "tbs" / "predictions" / "reference" / measured.MEASURED


def rows_of(gpu: str) -> pd.DataFrame:
    """Every inference profile of one GPU folder as reference rows."""
    precision = precision_of(load_catalog()[gpu])
    parts = []
    for directory in sorted((PROFILES / gpu).glob("*/inference")):
        model = directory.parent.name
        on_cpu = PROFILES / "cpu" / model / "inference"
        cpu = [load_profile(on_cpu)] if on_cpu.is_dir() else []
        where = str(directory.relative_to(ROOT))
        parts.append(measured.measured_rows(load_profile(directory), cpu, model, gpu, precision, where))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=measured.COLUMNS)


def main() -> None:
    specs, catalog = gpu_specs(), load_catalog()
    gpus = sorted(p.name for p in PROFILES.iterdir() if p.is_dir() and p.name in specs and p.name in catalog)
    table = pd.concat([rows_of(gpu) for gpu in gpus], ignore_index=True) if gpus else \
        pd.DataFrame(columns=measured.COLUMNS)
    table.to_csv(OUT, index=False, float_format="%.6g")
    counts = table.groupby(["device", "model", "kind"]).size()
    print(f"{len(table)} rows from {', '.join(gpus) or 'no GPU profiles'} -> {OUT.relative_to(ROOT)}")
    print(counts.to_string())


if __name__ == "__main__":
    main()
