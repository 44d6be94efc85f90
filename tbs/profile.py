"""The profile on disk: raw samples, per-cell summaries, whole-model rows, metadata.

Rows are appended as each cell finishes, so an interrupted run keeps everything
measured; ``metadata.json`` says whether the profile is complete. Files:

- ``samples.csv``  one row per timed sample (raw wall seconds, iterations, harness cost)
- ``summary.csv``  one row per layer x device x batch size
- ``model.csv``    one row per device x batch size: the whole model's compiled forward pass,
                   its fixed costs, and the sum of its layers' medians
- ``metadata.json`` model, layers, layer graph, host, devices, versions, settings, status
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from tbs.errors import ProfileError

SUMMARY_COLUMNS = [
    "layer", "layer_type", "category", "device", "device_kind", "batch_size", "mode", "status",
    "reason", "n", "iterations", "median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s",
    "per_sample_s", "usd_per_hour", "cost_per_sample_usd", "first_call_s", "host",
]
MODEL_COLUMNS = [
    "device", "device_kind", "batch_size", "mode", "status", "reason", "n", "iterations",
    "median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s", "per_sample_s", "layers_sum_s",
    "layers_sum_per_sample_s", "layers_measured", "dispatch_overhead_s", "input_copy_s",
    "input_bytes", "first_call_s", "usd_per_hour", "cost_per_sample_usd", "host",
]
TRANSFER_COLUMNS = ["src", "dst", "bytes", "sample", "seconds"]
SAMPLE_COLUMNS = [
    "target", "layer", "device", "batch_size", "mode", "sample", "iterations", "raw_seconds",
    "harness_call_s", "harness_iteration_s", "seconds_per_call", "host",
]
MODEL_LAYER = "(model)"  # the layer column of whole-model samples
STATUSES = ("ok", "noisy", "oom", "error", "cpu-fallback", "unsupported")


# Settings that change what a number means: a resumed profile must match them.
MEASUREMENT_SETTINGS = ("mode", "xla", "input_source", "prices_usd_per_hour", "timing", "backend")


@contextmanager
def _no_interrupts():
    """Hold Ctrl-C until a file write is complete, so no row is ever half-written."""
    blockable = hasattr(signal, "pthread_sigmask")
    if blockable:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if blockable:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    with _no_interrupts():
        os.replace(tmp, path)


def cell_key(target: str, layer: str, device: str, batch_size: int, mode: str) -> tuple:
    return (target, layer, device, int(batch_size), mode)


@dataclass
class Profile:
    """A loaded profile: the one result object that cost, placement and reports read."""

    directory: Path
    metadata: dict[str, Any]
    summary: pd.DataFrame
    model: pd.DataFrame
    samples: pd.DataFrame

    @property
    def complete(self) -> bool:
        return self.metadata.get("status") == "complete"


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=columns)
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise ProfileError(f"'{path}' is damaged ({str(exc).splitlines()[0]}); re-run tbs profile without --resume") from None
    for column in columns:
        if column not in frame.columns:
            frame[column] = None
    return frame


def load_profile(directory: Path) -> Profile:
    directory = Path(directory)
    meta_path = directory / "metadata.json"
    if not meta_path.is_file():
        raise ProfileError(f"'{directory}' is not a tbs profile (no metadata.json); run tbs profile first")
    try:
        metadata = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        raise ProfileError(f"'{meta_path}' is unreadable ({exc}); re-run tbs profile") from None
    return Profile(
        directory=directory,
        metadata=metadata,
        summary=_read_csv(directory / "summary.csv", SUMMARY_COLUMNS),
        model=_read_csv(directory / "model.csv", MODEL_COLUMNS),
        samples=_read_csv(directory / "samples.csv", SAMPLE_COLUMNS),
    )


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    with _no_interrupts():
        os.replace(tmp, path)


class ProfileStore:
    """Writes a profile directory incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.metadata: dict[str, Any] = {}
        self._done: set[tuple] = set()

    @property
    def paths(self) -> dict[str, Path]:
        d = self.directory
        return {"summary": d / "summary.csv", "model": d / "model.csv", "samples": d / "samples.csv",
                "transfers": d / "transfers.csv", "metadata": d / "metadata.json"}

    def existing_status(self) -> str | None:
        path = self.paths["metadata"]
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text()).get("status", "unknown")
        except (json.JSONDecodeError, OSError):
            return "unreadable"

    def create(self, metadata: dict[str, Any]) -> None:
        """Start a fresh profile (removing an old one's files)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProfileError(f"cannot create profile directory '{self.directory}' ({exc.strerror}); choose another --out") from None
        for path in self.paths.values():
            path.unlink(missing_ok=True)
        (self.directory / "report.html").unlink(missing_ok=True)
        self.metadata = dict(metadata, status="running")
        _write_json_atomic(self.paths["metadata"], self.metadata)

    def resume(self, metadata: dict[str, Any]) -> int:
        """Reopen an unfinished profile of the same model; returns the number of finished cells."""
        old = load_profile(self.directory)
        old_sha = old.metadata.get("model", {}).get("sha256")
        new_sha = metadata.get("model", {}).get("sha256")
        if old_sha and new_sha and old_sha != new_sha:
            raise ProfileError(
                f"--resume: '{self.directory}' holds a profile of a different model file; use --out for a new directory"
            )
        for setting in MEASUREMENT_SETTINGS:
            if setting in old.metadata and setting in metadata and old.metadata[setting] != metadata[setting]:
                raise ProfileError(
                    f"--resume: {setting} differs from the unfinished profile's ({old.metadata[setting]!r}); "
                    f"resume with the same options, or use --out for a new profile"
                )
        # Failed cells are tried again: an OOM or error may not recur.
        failed = ("oom", "error")
        if len(old.summary) and old.summary["status"].isin(failed).any():
            old.summary = old.summary[~old.summary["status"].isin(failed)]
            write_csv_atomic(old.summary, self.paths["summary"])
        if len(old.model) and old.model["status"].isin(failed).any():
            old.model = old.model[~old.model["status"].isin(failed)]
            write_csv_atomic(old.model, self.paths["model"])
        for row in old.summary.itertuples(index=False):
            self._done.add(cell_key("layer", row.layer, row.device, row.batch_size, row.mode))
        for row in old.model.itertuples(index=False):
            self._done.add(cell_key("model", MODEL_LAYER, row.device, row.batch_size, row.mode))
        # Samples of a cell whose summary row never landed are dropped: that cell is re-measured.
        if len(old.samples):
            keep = [
                cell_key(r.target, r.layer, r.device, r.batch_size, r.mode) in self._done
                for r in old.samples.itertuples(index=False)
            ]
            write_csv_atomic(old.samples[keep], self.paths["samples"])
        merged = dict(old.metadata)
        merged.update({k: v for k, v in metadata.items() if k not in ("layers", "graph")})
        for key in ("layers", "graph"):
            merged[key] = old.metadata.get(key) or metadata.get(key)
        merged["resumed"] = int(old.metadata.get("resumed", 0)) + 1
        merged["status"] = "running"
        self.metadata = merged
        _write_json_atomic(self.paths["metadata"], self.metadata)
        return len(self._done)

    def is_done(self, key: tuple) -> bool:
        return key in self._done

    def _append(self, name: str, rows: Iterable[dict[str, Any]], columns: list[str]) -> None:
        frame = pd.DataFrame(list(rows), columns=columns)
        if frame.empty:
            return
        path = self.paths[name]
        with _no_interrupts():
            frame.to_csv(path, mode="a", header=not path.exists() or path.stat().st_size == 0, index=False)

    def add_cell(self, key: tuple, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """Write one finished cell: its samples first, then its summary row (which marks it done)."""
        self._append("samples", samples, SAMPLE_COLUMNS)
        if key[0] == "model":
            self._append("model", [row], MODEL_COLUMNS)
        else:
            self._append("summary", [row], SUMMARY_COLUMNS)
        self._done.add(key)

    def add_transfers(self, rows: list[dict[str, Any]]) -> None:
        self._append("transfers", rows, TRANSFER_COLUMNS)

    def update_metadata(self, **values: Any) -> None:
        self.metadata.update(values)
        _write_json_atomic(self.paths["metadata"], self.metadata)

    def finish(self, status: str) -> None:
        self.update_metadata(status=status)


def with_layer_sums(summary: pd.DataFrame, model: pd.DataFrame) -> pd.DataFrame:
    """Model rows plus the sum of their layers' medians (over measured layers only)."""
    model = model.copy()
    if model.empty:
        return model
    measured = summary[summary["median_s"].notna()] if not summary.empty else summary
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


def in_layer_order(summary: pd.DataFrame, layers: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows by batch size, device, then the model's layer order (cells finish in any order)."""
    rank = {layer["name"]: i for i, layer in enumerate(layers)}
    order = summary["layer"].map(lambda name: rank.get(name, len(rank)))
    return (summary.assign(_order=order).sort_values(["batch_size", "device", "_order"], kind="stable")
            .drop(columns="_order").reset_index(drop=True))


def finalize(store: ProfileStore) -> None:
    """Sort summary.csv, add the derived Σ-per-layer columns to model.csv, mark the profile complete."""
    profile = load_profile(store.directory)
    if not profile.summary.empty:
        write_csv_atomic(in_layer_order(profile.summary, profile.metadata.get("layers", [])), store.paths["summary"])
    if not profile.model.empty:
        write_csv_atomic(with_layer_sums(profile.summary, profile.model), store.paths["model"])
    store.finish("complete")
