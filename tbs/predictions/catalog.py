"""The device catalog shipped with tbs: peaks, memory, bandwidth and prices of hardware the user may not have.

``catalog.csv`` (package data) holds one row per device unit (one GPU, one TPU chip, one
CPU VM), each figure with its source and date. A missing figure is blank and stays None
here, never 0; a catalog sentinel (a placeholder such as 700.0 for "not offered") is
never a price. The peak that matters for a float32 model is not always the FP32 one:
JAX and TensorFlow run float32 matmuls as TF32 on Ampere and later GPUs and in bfloat16
passes on TPUs (``float32_matmul_runs_as``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

import pandas as pd

from tbs.errors import TbsError

PEAK_COLUMNS = {"float32": "peak_float32_flops_per_s", "tf32": "peak_tf32_flops_per_s",
                "bfloat16": "peak_bfloat16_flops_per_s", "float16": "peak_float16_flops_per_s"}
# Placeholders some price feeds use for "not offered here"; never a price.
PRICE_SENTINELS = frozenset({700.0, 999.0, 9999.0, 99999.0})
_NUMBERS = (*PEAK_COLUMNS.values(), "memory_bytes", "memory_bandwidth_bytes_per_s", "usd_per_hour", "spot_usd_per_hour")


def _value(raw: Any) -> float | None:
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class CatalogDevice:
    """One catalog row, its blanks as None."""

    id: str
    kind: str
    name: str
    unit: str
    peaks_flops_per_s: dict[str, float]  # float32 / tf32 / bfloat16 / float16 -> dense peak
    float32_matmul_runs_as: str
    memory_bytes: float | None
    memory_bandwidth_bytes_per_s: float | None
    sm_count: int | None  # a GPU's streaming multiprocessors: the GPU model's waves of tiles
    base_clock_hz: float | None  # base and boost clocks: how much of its peak a GPU sustains
    boost_clock_hz: float | None
    l2_bytes: float | None
    architecture: str  # turing, ampere, ada, hopper: the GPU model's per-architecture correction
    usd_per_hour: float | None
    spot_usd_per_hour: float | None
    price: dict[str, str]  # provider, region, instance, includes_host, date, source
    spec_source: str
    notes: str

    def matmul_peak(self, dtype: str = "float32") -> float | None:
        """The peak a ``dtype`` matmul runs at by default (float32 as TF32 or bfloat16 where the stack does so)."""
        used = self.float32_matmul_runs_as if dtype == "float32" else dtype
        return self.peaks_flops_per_s.get(used) or (self.peaks_flops_per_s.get(dtype) if used != dtype else None)

    def vector_peak(self) -> float | None:
        """Elementwise work: the FP32 vector peak, else (TPUs publish none) the matmul peak."""
        return self.peaks_flops_per_s.get("float32") or self.matmul_peak("float32")


def _device(row: pd.Series) -> CatalogDevice:
    def text(column: str) -> str:
        value = row.get(column)
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)

    price = _value(row.get("usd_per_hour"))
    spot = _value(row.get("spot_usd_per_hour"))
    return CatalogDevice(
        id=text("id"), kind=text("kind"), name=text("name"), unit=text("unit"),
        peaks_flops_per_s={k: v for k, c in PEAK_COLUMNS.items() if (v := _value(row.get(c))) is not None},
        float32_matmul_runs_as=text("float32_matmul_runs_as") or "float32",
        memory_bytes=_value(row.get("memory_bytes")),
        memory_bandwidth_bytes_per_s=_value(row.get("memory_bandwidth_bytes_per_s")),
        sm_count=int(sms) if (sms := _value(row.get("sm_count"))) is not None else None,
        base_clock_hz=_value(row.get("base_clock_hz")), boost_clock_hz=_value(row.get("boost_clock_hz")),
        l2_bytes=_value(row.get("l2_bytes")), architecture=text("architecture").lower(),
        usd_per_hour=None if price in PRICE_SENTINELS else price,
        spot_usd_per_hour=None if spot in PRICE_SENTINELS else spot,
        price={k: text(f"price_{k}") for k in ("provider", "region", "instance", "includes_host", "date", "source")},
        spec_source=text("spec_source"), notes=text("notes"))


def load_catalog(path: str | None = None) -> dict[str, CatalogDevice]:
    """The catalog (the shipped one, or a CSV of the same columns), by id."""
    try:
        if path is None:
            with resources.files("tbs.predictions").joinpath("catalog.csv").open() as handle:
                frame = pd.read_csv(handle)
        else:
            frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise TbsError(f"cannot read the device catalog '{path or 'catalog.csv'}' ({exc}); check the file") from None
    missing = [c for c in ("id", "kind", *_NUMBERS) if c not in frame.columns]
    if missing:
        raise TbsError(f"device catalog '{path}' lacks columns {', '.join(missing)}; start from tbs/predictions/catalog.csv")
    return {str(row["id"]).strip().lower(): _device(row) for _, row in frame.iterrows()}


def catalog_frame(catalog: dict[str, CatalogDevice] | None = None) -> pd.DataFrame:
    """The catalog as a table (``tbs devices --catalog``): blanks stay blank."""
    rows = []
    for device in (catalog or load_catalog()).values():
        rows.append({"id": device.id, "kind": device.kind, "name": device.name, "unit": device.unit,
                     "float32_matmul_runs_as": device.float32_matmul_runs_as,
                     "float32_matmul_peak_flops_per_s": device.matmul_peak("float32"),
                     "memory_bytes": device.memory_bytes,
                     "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s,
                     "usd_per_hour": device.usd_per_hour, "spot_usd_per_hour": device.spot_usd_per_hour,
                     "price_region": device.price["region"], "price_date": device.price["date"]})
    return pd.DataFrame(rows)


def resolve(ids: Iterable[str], catalog: dict[str, CatalogDevice]) -> list[CatalogDevice]:
    """Catalog rows for ``ids`` ('l4,h100' or a list); one line naming an unknown id and the known ones."""
    if isinstance(ids, str):
        ids = ids.split(",")
    chosen = [i.strip().lower() for i in ids if i and i.strip()]
    if not chosen:
        raise TbsError(f"--device: no device given; choose from {', '.join(catalog)}")
    for name in chosen:
        if name not in catalog:
            raise TbsError(f"--device: '{name}' is not in the device catalog; choose from {', '.join(catalog)}")
    return [catalog[name] for name in dict.fromkeys(chosen)]
