"""A profile as one Python object: the result that cost, placement and every report read.

``load_profile`` reads a profile directory (checking its format version);
``Profile.save`` writes one, so a profile measured into a temporary directory,
merged or re-priced can be kept.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tbs.errors import ProfileError, StorageError, warn
from tbs.profiles.csvfiles import read_table
from tbs.profiles.files import set_aside, write_csv_atomic, write_json_atomic
from tbs.profiles.metadata import check_metadata
from tbs.profiles.roofline import with_roofline
from tbs.measure.in_context import with_in_model
from tbs.columns import (ANALYSIS_COLUMNS, MODEL_COLUMNS, OPS_COLUMNS, PREDICTION_COLUMNS, SAMPLE_COLUMNS,
                         SUMMARY_COLUMNS, TRANSFER_COLUMNS)
from tbs.endpoints import current_graph
from tbs.schema import DEFAULT_BACKEND, FORMAT_VERSION, READABLE_VERSIONS, LayerRecord, Metadata, ProfileStatus, check_declared

FILES = {"summary": SUMMARY_COLUMNS, "model": MODEL_COLUMNS, "samples": SAMPLE_COLUMNS, "transfers": TRANSFER_COLUMNS,
         "analysis": ANALYSIS_COLUMNS, "predictions": PREDICTION_COLUMNS, "ops": OPS_COLUMNS}
PROFILE_FILE_NAMES = [*(f"{name}.csv" for name in FILES), "metadata.json"]


@dataclass
class Profile:
    """Every cell measured for one model (or several machines' profiles of it, merged).

    ``summary``: one row per layer x device x batch size; ``model``: the whole model per
    device and batch, with the sum of its layers; ``samples``: every raw timing;
    ``transfers``: the copy-cost samples between devices; ``analysis``: the compiler's
    FLOPs, bytes and memory per program; ``predictions``: cells for devices not measured
    (``tbs.predict``), never mixed into ``summary``; ``metadata``: what was measured, where and how.
    """

    directory: Path
    metadata: dict[str, Any]  # metadata.json as read; every stage reads it typed, through ``meta``
    summary: pd.DataFrame
    model: pd.DataFrame
    samples: pd.DataFrame
    transfers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TRANSFER_COLUMNS))
    analysis: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=ANALYSIS_COLUMNS))
    predictions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PREDICTION_COLUMNS))
    ops: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OPS_COLUMNS))

    @property
    def complete(self) -> bool:
        return self.meta.status == ProfileStatus.COMPLETE

    @property
    def name(self) -> str:
        return str(self.meta.model.get("name", self.directory.name))

    @property
    def meta(self) -> Metadata:
        """The metadata, typed (tbs.schema.Metadata): how every stage reads it."""
        return Metadata.from_dict(self.metadata)

    @property
    def backend(self) -> str:
        """The Keras backend it was measured on (profiles that predate the field ran on the default)."""
        return str(self.meta.backend or DEFAULT_BACKEND)

    @property
    def mode(self) -> str:
        return str(self.meta.mode or "inference")

    @property
    def hostname(self) -> str:
        """The machine it was measured on: merged reports name devices by it."""
        return str(self.meta.host.get("hostname", "host"))

    @property
    def layers(self) -> list[LayerRecord]:
        """Every leaf layer call, in call order, typed."""
        return self.meta.layer_records()

    @property
    def layer_names(self) -> list[str]:
        return [str(entry["name"]) for entry in self.meta.layers]

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({int(b) for b in self.meta.batch_sizes})

    @property
    def devices(self) -> list[str]:
        return [str(d["name"]) for d in self.meta.devices]

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write this profile as a profile directory (any tbs command can read it back).

        Another profile already in ``directory`` is moved aside (``DIR.previous-<time>``), never overwritten.
        """
        if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
            raise ProfileError(f"directory={directory!r}: give a directory path (a str or pathlib.Path)")
        target = Path(directory)
        fix = "choose another directory"
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(target, exc, fix) from None
        if target.resolve() != self.directory.resolve():
            moved = set_aside(target, [*PROFILE_FILE_NAMES, "report.html"])
            if moved is not None:
                warn(f"'{target}' held another profile: it was moved to '{moved}' (nothing measured is deleted)")
        for name, columns in FILES.items():
            frame = getattr(self, name)
            write_csv_atomic(frame[[c for c in columns if c in frame.columns]], target / f"{name}.csv", fix)
        check_declared(self.metadata)
        write_json_atomic(target / "metadata.json", dict(self.metadata), fix)
        report = self.directory / "report.html"
        if report.is_file() and report.resolve() != (target / "report.html").resolve():
            try:
                shutil.copyfile(report, target / "report.html")
            except OSError as exc:
                raise StorageError(target / "report.html", exc, fix) from None
        return target

    def save_predictions(self) -> Path:
        """Write ``predictions`` (and the metadata saying how they were made) into this profile's directory."""
        fix = (f"copy the profile to a writable directory (cp -r {self.directory} DIR) "
               f"and predict there")
        write_csv_atomic(self.predictions[PREDICTION_COLUMNS], self.directory / "predictions.csv", fix)
        check_declared(self.metadata)
        write_json_atomic(self.directory / "metadata.json", dict(self.metadata), fix)
        return self.directory / "predictions.csv"

    def __repr__(self) -> str:
        return (f"<tbs.Profile {self.name}: {len(self.layers)} layers, devices {', '.join(self.devices) or '-'}, "
                f"batch {', '.join(map(str, self.batch_sizes)) or '-'}, {len(self.summary)} cells, "
                f"{self.meta.status or '?'} ({self.directory})>")

    def _repr_html_(self) -> str:
        """A compact table in Jupyter: the whole model per device and batch, not every cell."""
        from html import escape

        model = self.model
        columns = [c for c in ("device", "batch_size", "status", "per_sample_s", "layers_sum_per_sample_s",
                               "cost_per_sample_usd") if c in model.columns]
        table = model[columns].to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}",
                                       max_rows=20, border=0)
        return (f"<div><b>tbs profile of {escape(self.name)}</b> — {len(self.layers)} layers, "
                f"{len(self.summary)} layer cells, {escape(str(self.meta.status or '?'))}, "
                f"{escape(self.mode)} on {escape(self.backend)}<br>{table}"
                f"<small>Per-layer rows: <code>.summary</code>; raw samples: <code>.samples</code>; "
                f"<code>tbs.render(p, \"html\")</code> for the full report.</small></div>")


def check_version(metadata: dict[str, Any], where: Path) -> None:
    """Refuse a profile whose format this tbs cannot read, naming the tbs that wrote it."""
    meta = Metadata.from_dict(metadata)
    version = meta.tbs_profile_version or 1
    if version not in READABLE_VERSIONS:
        writer = meta.tbs_version or "an unknown tbs version"
        raise ProfileError(
            f"'{where}' is profile format {version}, written by tbs {writer}; this tbs reads formats "
            f"{', '.join(map(str, READABLE_VERSIONS))} (up to {FORMAT_VERSION}): upgrade tbs, or re-run tbs profile"
        )


def _upgrade_graph(metadata: dict[str, Any]) -> None:
    """An older profile's graph in this version's endpoint names, in memory (a --resume writes it so)."""
    graph = metadata.get("graph")
    if not isinstance(graph, dict) or not graph:
        return
    layers = {e["name"] for e in metadata.get("layers") or [] if isinstance(e, dict) and "name" in e}
    try:
        metadata["graph"] = current_graph(graph, int(metadata.get("tbs_profile_version") or 1), layers)
    except (TypeError, KeyError, AttributeError):  # a damaged graph is left as it is: loading never refused one
        pass


def load_profile(directory: str | os.PathLike[str]) -> Profile:
    directory = Path(directory)
    meta_path = directory / "metadata.json"
    if not meta_path.is_file():
        raise ProfileError(f"'{directory}' is not a tbs profile (no metadata.json); run tbs profile first")
    try:
        metadata = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        raise ProfileError(f"'{meta_path}' is unreadable ({exc}); re-run tbs profile") from None
    if not isinstance(metadata, dict):
        raise ProfileError(f"'{meta_path}' is not a tbs profile's metadata; re-run tbs profile")
    check_version(metadata, directory)
    check_metadata(metadata, str(meta_path))  # a damaged value: one line naming the file and the key
    _upgrade_graph(metadata)
    frames = {name: read_table(directory / f"{name}.csv", name, columns) for name, columns in FILES.items()}
    # A cell interrupted after its analysis was written is measured again on --resume: keep the last.
    frames["analysis"] = frames["analysis"].drop_duplicates(
        subset=["target", "layer", "device", "batch_size", "mode", "phase"], keep="last").reset_index(drop=True)
    meta = Metadata.from_dict(metadata)
    calibration, lookups = meta.calibration, _lookup_layers(meta)
    frames["summary"] = with_roofline(frames["summary"], calibration, lookups)[[c for c in SUMMARY_COLUMNS]]
    frames["model"] = with_roofline(frames["model"], calibration)[[c for c in MODEL_COLUMNS]]
    frames["summary"], frames["model"] = with_in_model(frames["summary"], frames["model"], frames["ops"],
                                                       [str(e["name"]) for e in meta.layers if isinstance(e, dict) and e.get("name")])
    return Profile(directory=directory, metadata=metadata, **frames)


def _lookup_layers(meta: Metadata) -> dict[str, LayerRecord]:
    """The Embedding layers whose roofline counts the rows they read, by name; an entry too damaged to read is
    left out (its roofline keeps the compiler's bytes) rather than refusing the profile."""
    out = {}
    for entry in meta.layers:
        if not isinstance(entry, dict) or entry.get("category") != "embedding":
            continue
        try:
            record = LayerRecord.from_dict(entry)
        except (TypeError, ValueError):
            continue
        out[record.name] = record
    return out


def with_layer_sums(summary: pd.DataFrame, model: pd.DataFrame) -> pd.DataFrame:
    """Model rows plus the sum of their layers' medians (over measured layers only)."""
    model = model.copy()
    if model.empty:
        return model
    measured = summary[summary["median_s"].notna()] if not summary.empty else summary
    if "in_step" in measured:  # a row the compiled train step never runs is shown, not summed
        measured = measured[measured["in_step"].map(lambda v: v is not False)]
    if measured.empty:
        model["layers_sum_s"] = None
        model["layers_measured"] = 0
    else:
        sums = measured.groupby(["device", "batch_size", "mode"]).agg(
            layers_sum_s=("median_s", "sum"), layers_measured=("median_s", "size")
        ).reset_index()
        model = model.drop(columns=["layers_sum_s", "layers_measured"], errors="ignore").merge(
            sums, on=["device", "batch_size", "mode"], how="left"
        )
    model["layers_sum_per_sample_s"] = model["layers_sum_s"] / model["batch_size"]
    return model[[c for c in MODEL_COLUMNS if c in model.columns]]


def in_layer_order(summary: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Rows by batch size, device, then the model's layer order (cells finish in any order)."""
    rank = {name: i for i, name in enumerate(names)}
    order = summary["layer"].map(lambda name: rank.get(name, len(rank)))
    return (summary.assign(_order=order).sort_values(["batch_size", "device", "_order"], kind="stable")
            .drop(columns="_order").reset_index(drop=True))


