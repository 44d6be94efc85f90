"""Published GPU measurements (measurements.csv) and the datasheets of the GPUs they were taken on (gpu_specs.csv).

Where each row comes from, under which license and how it was derived is in this folder's
README.md. The GPU model's constants are fitted on these rows (``fitted_model``); the
prediction benchmark holds one GPU out at a time (benchmarks/predict_gpu.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path
from importlib import resources

import pandas as pd

from tbs.predictions.gpu_fit import fit
from tbs.predictions.reference import measured
from tbs.predictions.gpu_model import GpuModel, GpuSpec, frame_of
from tbs.predictions.work import CONV, GATES, GEMM, MEMORY, RECURRENT, Work

GEMM_OPS = ("gemm", "linear", "matmul", "bmm")
RNN_OPS = ("lstm", "gru", "rnn")
FRAMEWORK_TIMED = ("pytorch",)  # sources that timed framework calls (their per-op overhead is fitted apart)
# Operands over this share of the GPU's memory are left out: at that size paging and the allocator, not the
# kernel, set the time (NeuSight's 15 GB GEMMs on a 16 GB P100 ran at a quarter of the rate of 1 GB ones).
MAX_MEMORY_SHARE = 0.25
MIN_SOURCE_ROWS = 50  # a source's rows are fitted on from this many (outside the check-only models); scored below


def _read(name: str) -> pd.DataFrame:
    with resources.files("tbs.predictions.reference").joinpath(name).open() as handle:
        return pd.read_csv(handle)


@lru_cache(maxsize=1)
def _specs_table() -> pd.DataFrame:
    return _read("gpu_specs.csv")


@lru_cache(maxsize=1)
def gpu_specs() -> dict[str, GpuSpec]:
    """The reference GPUs' datasheets, by id."""
    specs = {}
    for _, row in _specs_table().iterrows():
        peaks = {p: float(row[c]) for p, c in (("fp32", "peak_float32_flops_per_s"), ("tf32", "peak_tf32_flops_per_s"),
                                              ("fp16", "peak_float16_flops_per_s")) if _number(row.get(c))}
        specs[str(row["id"])] = GpuSpec(str(row["id"]), int(row["sm_count"]), peaks,
                                        float(row["memory_bandwidth_bytes_per_s"]),
                                        *(float(row[c]) if _number(row.get(c)) else None
                                          for c in ("base_clock_hz", "boost_clock_hz", "l2_bytes")),
                                        str(row.get("architecture") or ""))
    return specs


def _number(value: object) -> bool:
    try:
        return math.isfinite(float(value)) and float(value) > 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _int(row: pd.Series, column: str, default: int = 0) -> int:
    value = row.get(column)
    return int(float(value)) if _number(value) else default


def _conv_output(size: int, kernel: int, stride: int, padding: object) -> int:
    if str(padding).lower() == "same":
        return math.ceil(size / stride)
    pad = int(float(padding)) if _number(padding) else 0
    return (size + 2 * pad - kernel) // stride + 1


def work_of_row(row: pd.Series) -> Work | None:
    """A reference row as the work the GPU model prices (None for an op it does not price)."""
    op, phase = str(row["op"]).lower(), str(row.get("phase") or "forward")
    flops, moved = float(row["flops"]), float(row["bytes"])
    if op in GEMM_OPS:  # batch: the number of matrices of a batched matmul
        return Work(GEMM, flops, moved, m=_int(row, "m"), n=_int(row, "n"), k=_int(row, "k"),
                    count=max(1, _int(row, "batch", 1)), phase=phase)
    if op == "conv2d":
        stride = max(1, _int(row, "stride", 1))
        kh, kw = _int(row, "kernel_h", 1), _int(row, "kernel_w", 1)
        out_h = _conv_output(_int(row, "in_h"), kh, stride, row.get("padding"))
        out_w = _conv_output(_int(row, "in_w"), kw, stride, row.get("padding"))
        return Work(CONV, flops, moved, m=_int(row, "batch", 1) * out_h * out_w, n=_int(row, "out_c"),
                    k=kh * kw * _int(row, "in_c"), phase=phase, winograd=kh == kw == 3 and stride == 1,
                    tensor_core_aligned=_int(row, "in_c") % 8 == 0, window=kh * kw, stride=stride)
    if op in RNN_OPS:
        batch, hidden, steps = _int(row, "batch", 1), _int(row, "hidden"), _int(row, "seq_len", 1)
        gates = GATES[op]
        features = _int(row, "input_size")  # 0: the inputs' projection was not part of what was timed
        return Work(RECURRENT, flops, moved, m=batch, n=gates * hidden, k=hidden, steps=steps,
                    input_gemm=(batch * steps, gates * hidden, features) if features else None, fused=True,
                    phase=phase)
    return Work(MEMORY, flops, moved, phase=phase)


@lru_cache(maxsize=1)
def reference_table() -> pd.DataFrame:
    """Every usable reference row as the GPU model's table, with ``measured_s``, ``device`` and ``source``: the
    published rows, then tbs's own (measured.csv; ``check_only`` rows are scored, never fitted on)."""
    published = _published_table()
    return pd.concat([published.assign(check_only=False), _measured_table()], ignore_index=True)


def _measured_table() -> pd.DataFrame:
    """measured.csv (tbs's own GPU rows) as the GPU model's table."""
    rows = _read(measured.MEASURED)
    specs = gpu_specs()
    rows = rows[rows["device"].astype(str).isin(specs)].reset_index(drop=True)
    frame = frame_of(measured.works_of(rows), rows["precision"].astype(str), [specs[str(d)] for d in rows["device"]])
    for column in ("device", "source", "framework", "model", "layer", "category"):
        frame[column] = rows[column].astype(str)
    frame["op"] = frame["kind"]
    frame["batch"] = rows["batch"].astype(int)
    frame["measured_s"] = rows["measured_seconds"].astype(float)
    frame["framework_overhead"], frame["calls_before"], frame["call"] = False, 0.0, ""
    frame["check_only"] = rows["check_only"].astype(str) == "True"
    return frame


def _published_table() -> pd.DataFrame:
    """DeepBench's and NeuSight's rows (measurements.csv) as the GPU model's table."""
    rows = _read("measurements.csv")
    specs = gpu_specs()
    works, precisions, chosen, keep = [], [], [], []
    for index, row in rows.iterrows():
        work = work_of_row(row)
        spec = specs.get(str(row["device"]))
        if work is None or spec is None or not _number(row["measured_seconds"]):
            continue
        works.append(work)
        # P100 "pseudo-fp16" stores fp16 but computes in fp32: its rate is the fp32 one
        precisions.append("fp32" if "pseudo-fp16" in str(row.get("notes", "")) else str(row["precision"]))
        chosen.append(spec)
        keep.append(index)
    frame = frame_of(works, precisions, chosen)
    kept = rows.loc[keep].reset_index(drop=True)
    for column in ("device", "source", "op", "framework"):
        frame[column] = kept[column].astype(str)
    frame["measured_s"] = kept["measured_seconds"].astype(float)
    frame["framework_overhead"] = frame["framework"].str.startswith(FRAMEWORK_TIMED)
    # NeuSight's convolutions: how many shapes their process had timed before (its per-call cost grows with them).
    frame["calls_before"] = pd.to_numeric(kept.get("calls_before"), errors="coerce").fillna(0.0).to_numpy() \
        if "calls_before" in kept else 0.0
    # Which call was timed, where its host cost differs: NeuSight's micro-benchmarks of LayerNorm and softmax called
    # nn.Module objects (their model traces replay graph nodes, priced as every other framework call).
    micro = frame["framework_overhead"] & ~kept["source_path"].astype(str).str.contains("/label/")
    frame["call"] = frame["op"].where(micro & frame["op"].isin(["layernorm", "softmax"]), "")
    memory = frame["device"].map(_memory_bytes()).astype(float)
    return frame[~(frame["bytes"] > MAX_MEMORY_SHARE * memory)].reset_index(drop=True)


def _memory_bytes() -> dict[str, float]:
    specs = _specs_table()
    return {str(i): float(v) for i, v in zip(specs["id"], specs["memory_bytes"]) if _number(v)}


def fit_table(table: pd.DataFrame) -> GpuModel:
    """The GPU model fitted on some reference rows: never on ``check_only`` ones, nor on a source with fewer than
    ``MIN_SOURCE_ROWS`` rows (scored, not fitted: tbs's own has 3 today, and 3 rows of one GPU, a band-tuning fold
    of their own, narrowed the GEMM bands until the H100's rows fell to 83% inside them)."""
    if "check_only" in table:
        table = table[~table["check_only"].astype(bool)]
    if "source" in table:
        table = table[table["source"].map(table["source"].value_counts()) >= MIN_SOURCE_ROWS]
    return fit(table, table["measured_s"].to_numpy(dtype=float))


FITTED = "fitted.json"


def data_digest() -> dict[str, str]:
    """sha256 of the reference files: fitted.json is valid for these exact files only."""
    folder = resources.files("tbs.predictions.reference")
    return {name: hashlib.sha256(folder.joinpath(name).read_bytes()).hexdigest()
            for name in ("measurements.csv", "gpu_specs.csv", measured.MEASURED)}


def refit() -> dict:
    """Fit on every reference row and write fitted.json (``python -m tbs.predictions.reference``)."""
    model = fit_table(reference_table())
    record = {"digest": data_digest(), "model": model.as_dict()}
    path = Path(str(resources.files("tbs.predictions.reference").joinpath(FITTED)))
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


@lru_cache(maxsize=1)
def fitted_model() -> GpuModel:
    """The GPU model fitted on every reference row (what ``tbs predict`` uses for GPUs), as shipped in fitted.json."""
    with resources.files("tbs.predictions.reference").joinpath(FITTED).open() as handle:
        record = json.load(handle)
    values = dict(record["model"])
    values["bands"] = {k: tuple(v) for k, v in values.get("bands", {}).items()}
    values["size_curves"] = {k: (list(v[0]), list(v[1])) for k, v in values.get("size_curves", {}).items()}
    return GpuModel(**values)


