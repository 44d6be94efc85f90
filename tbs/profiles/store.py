"""Writing a profile directory as it is measured: rows appended per cell, metadata kept current.

Rows are appended as each cell finishes, so an interrupted run keeps everything
measured; ``metadata.json`` says whether the profile is complete. Files:

- ``samples.csv``  one row per timed sample (raw wall seconds, iterations, harness cost)
- ``summary.csv``  one row per layer x device x batch size
- ``model.csv``    one row per device x batch size: the whole model's compiled forward pass,
                   its fixed costs, and the sum of its layers' medians
- ``transfers.csv`` copy-cost samples between devices
- ``ops.csv``      a few whole-model calls per device x batch traced with the framework's profiler, op by op
- ``metadata.json`` model, layers, layer graph, host, devices, versions, settings, status

One process at a time measures into a directory: ``ProfileStore.lock`` holds an
exclusive lock on ``.lock`` there for the whole run. The lock is POSIX flock: on
Windows (no ``fcntl``) directories are not locked, and two runs into one directory
are the user's to avoid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from tbs.errors import ProfileError, StorageError, describe_os_error
from tbs.profiles.csvfiles import drop_cut_tail
from tbs.profiles.files import Reserve, append_rows, set_aside, write_csv_atomic, write_json_atomic
from tbs.profiles.profile import FILES, PROFILE_FILE_NAMES, Profile, in_layer_order, load_profile, with_layer_sums
from tbs.profiles.rebuild import rebuilt_metadata
from tbs.schema import (FAILED, MEASUREMENT_SETTINGS, MODEL_LAYER, CellKey, LayerRecord, Metadata, ProfileStatus,
                        check_declared)

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - Windows: no flock, so no lock (see the module docstring)
    _fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"
UNREADABLE = "unreadable"  # existing_status(): metadata.json damaged or missing while measured rows are there


class ProfileStore:
    """Writes a profile directory incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.metadata: dict[str, Any] = {}
        self._done: set[CellKey] = set()
        self.resumed_rows: list[tuple[CellKey, dict[str, Any]]] = []  # the finished cells a resume found
        self._lock: Any = None
        self.reserve = Reserve(self.directory)
        self.set_aside_to: Path | None = None  # where create() moved an old profile that was in the way
        # What a failed write tells the user: nothing measured is lost, and how to go on.
        self.fix = (f"everything measured so far is kept in {self.directory}: make room (or copy it to a "
                    f"writable disk and use --out there), then run the same command with --resume")

    def lock(self) -> None:
        """Hold the directory for this process: a second run measuring into it would skew both.

        The lock is the kernel's (flock), so it is released when this process ends, however it ends.
        Without flock (Windows) the file is still written, naming this process, but nothing is locked.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.directory / LOCK_FILE, "a+")
        except OSError as exc:
            raise ProfileError(f"cannot create profile directory '{self.directory}' ({describe_os_error(exc)}); "
                               f"choose another --out") from None
        try:
            if _fcntl is not None:
                _fcntl.flock(handle.fileno(), _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ProfileError(
                f"'{self.directory}' is being measured by {holder}; wait for it to finish (or stop it), "
                f"or use --out DIR for another profile"
            ) from None
        try:  # who holds it, for the message above; a full disk only loses the name
            handle.seek(0)
            handle.truncate()
            handle.write(f"tbs process {os.getpid()}")
            handle.flush()
        except OSError:
            pass
        self._lock = handle

    def unlock(self) -> None:
        self.reserve.release()
        if self._lock is not None:
            try:
                self._lock.truncate(0)  # the file stays: removing it would race a process about to lock it
            except OSError:
                pass
            if _fcntl is not None:
                _fcntl.flock(self._lock.fileno(), _fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    @property
    def paths(self) -> dict[str, Path]:
        d = self.directory
        return {**{name: d / f"{name}.csv" for name in FILES}, "metadata": d / "metadata.json"}

    def existing_status(self) -> str | None:
        """The status of the profile in the directory; None if there is none, UNREADABLE if its metadata is lost."""
        path = self.paths["metadata"]
        if not path.exists():
            return UNREADABLE if self._has_rows() else None
        try:
            status = json.loads(path.read_text())["status"]
        except (json.JSONDecodeError, OSError, UnicodeDecodeError, KeyError, TypeError):
            return UNREADABLE
        return str(status)

    def _has_rows(self) -> bool:
        return any(self.paths[name].is_file() and self.paths[name].stat().st_size for name in ("summary", "model"))

    @property
    def meta(self) -> Metadata:
        """The metadata written so far, typed."""
        return Metadata.from_dict(self.metadata)

    def _write_metadata(self) -> None:
        check_declared(self.metadata)
        size = write_json_atomic(self.paths["metadata"], self.metadata, self.fix)
        self.reserve.hold(size, self.fix)  # room to mark the profile interrupted if the disk fills

    def create(self, metadata: dict[str, Any]) -> None:
        """Start a fresh profile; an old profile's files in the directory are moved aside (``set_aside_to``)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProfileError(f"cannot create profile directory '{self.directory}' ({describe_os_error(exc)}); "
                               f"choose another --out") from None
        if self._has_rows() or (self.paths["samples"].is_file() and self.paths["samples"].stat().st_size):
            self.set_aside_to = set_aside(self.directory, [*PROFILE_FILE_NAMES, "report.html"])
        for path in self.paths.values():  # what is left holds no measured row: empty files, a failed run's metadata
            path.unlink(missing_ok=True)
        (self.directory / "report.html").unlink(missing_ok=True)
        self.metadata = dict(metadata, status=ProfileStatus.RUNNING.value)
        self._write_metadata()

    def rebuild(self, metadata: dict[str, Any]) -> str:
        """metadata.json is damaged or missing, the rows are not: rebuild it from them and this run's options.

        The damaged file is kept beside (``metadata.json.damaged``). Returns what was done, for the user.
        """
        new, note = rebuilt_metadata(self.directory, metadata)
        damaged = self.paths["metadata"]
        if damaged.exists():
            keep = damaged.with_name("metadata.json.damaged")
            n = 1
            while keep.exists():
                n += 1
                keep = damaged.with_name(f"metadata.json.damaged-{n}")
            os.replace(damaged, keep)
            note += f"; the damaged file is kept as {keep.name}"
        self.metadata = dict(new, status=ProfileStatus.RUNNING.value)
        self._write_metadata()
        return note

    def resume(self, metadata: dict[str, Any]) -> int:
        """Reopen an unfinished profile of the same model; returns the number of finished cells."""
        old = load_profile(self.directory)  # refuses a damaged row before anything is changed
        self._check_same_run(old, metadata)
        for name in FILES:  # a row cut by a full disk or a kill: dropped (load_profile warned), then re-measured
            drop_cut_tail(self.paths[name])
        self._drop_failed(old)
        self._mark_done(old)
        self.metadata = _resumed_metadata(old, metadata)
        self._write_metadata()
        return len(self._done)

    def _check_same_run(self, old: Profile, metadata: dict[str, Any]) -> None:
        """Refuse to resume another model's profile, or one measured with other settings."""
        old_sha = old.meta.model.get("sha256")
        new_sha = Metadata.from_dict(metadata).model.get("sha256")
        if old_sha and new_sha and old_sha != new_sha:
            raise ProfileError(
                f"--resume: '{self.directory}' holds a profile of a different model file; use --out for a new directory"
            )
        for setting in MEASUREMENT_SETTINGS:
            if setting in old.metadata and setting in metadata and old.metadata[setting] != metadata[setting]:
                was = _describe(setting, old.metadata[setting])
                raise ProfileError(
                    f"--resume: {setting} differs from the unfinished profile's ({was}); "
                    f"resume with the same options, or use --out for a new profile"
                )

    def _drop_failed(self, old: Profile) -> None:
        """Failed cells are tried again (an OOM or error may not recur): their rows leave the files."""
        failed = list(FAILED)
        if len(old.summary) and old.summary["status"].isin(failed).any():
            old.summary = old.summary[~old.summary["status"].isin(failed)]
            write_csv_atomic(old.summary, self.paths["summary"], self.fix)
        if len(old.model) and old.model["status"].isin(failed).any():
            old.model = old.model[~old.model["status"].isin(failed)]
            write_csv_atomic(old.model, self.paths["model"], self.fix)

    def _mark_done(self, old: Profile) -> None:
        """Every kept row is a finished cell; samples of a cell whose row never landed are dropped (re-measured)."""
        for row in old.summary.to_dict("records"):
            key = CellKey.of("layer", row["layer"], row["device"], row["batch_size"], row["mode"])
            self._done.add(key)
            self.resumed_rows.append((key, row))
        for row in old.model.to_dict("records"):
            key = CellKey.of("model", MODEL_LAYER, row["device"], row["batch_size"], row["mode"])
            self._done.add(key)
            self.resumed_rows.append((key, row))
        if len(old.samples):
            keep = [
                CellKey.of(r.target, r.layer, r.device, r.batch_size, r.mode) in self._done
                for r in old.samples.itertuples(index=False)
            ]
            write_csv_atomic(old.samples[keep], self.paths["samples"], self.fix)
        if len(old.ops):  # traced calls of a whole-model cell whose row never landed: traced again with it
            keep = [CellKey.of("model", MODEL_LAYER, r.device, r.batch_size, r.mode) in self._done
                    for r in old.ops.itertuples(index=False)]
            write_csv_atomic(old.ops[keep], self.paths["ops"], self.fix)

    def is_done(self, key: CellKey) -> bool:
        """Whether the cell already has its row (from this run or the one resumed): skip it."""
        return key in self._done

    def _append(self, name: str, rows: Iterable[dict[str, Any]], columns: list[str]) -> None:
        frame = pd.DataFrame(list(rows), columns=columns)
        if not frame.empty:
            append_rows(frame, self.paths[name], self.fix)

    def add_cell(self, key: CellKey, row: dict[str, Any], samples: list[dict[str, Any]],
                 analysis: list[dict[str, Any]] = (), ops: list[dict[str, Any]] = ()) -> None:
        """Write one finished cell: its samples, analysis and traced ops first, then its summary row (which marks it done)."""
        self._append("samples", samples, FILES["samples"])
        self._append("analysis", analysis, FILES["analysis"])
        self._append("ops", ops, FILES["ops"])
        if key.target == "model":
            self._append("model", [row], FILES["model"])
        else:
            self._append("summary", [row], FILES["summary"])
        self._done.add(key)

    def add_transfers(self, rows: list[dict[str, Any]]) -> None:
        self._append("transfers", rows, FILES["transfers"])

    def update_metadata(self, **values: Any) -> None:
        self.metadata.update(values)
        self._write_metadata()

    @property
    def layers(self) -> list[LayerRecord]:
        """The layer records written so far, in call order."""
        return self.meta.layer_records()

    def set_layers(self, records: list[LayerRecord]) -> None:
        """Write the layer records (the metadata's only writer of "layers")."""
        self.update_metadata(layers=[r.as_dict() for r in records])

    def finish(self, status: ProfileStatus | str) -> None:
        self.update_metadata(status=str(status))
        self.reserve.release()

    def mark_interrupted(self, error: str) -> bool:
        """After a failed write: give back the reserve, then mark the profile interrupted (False if even that failed).

        A profile left ``running`` resumes all the same (its lock dies with the process).
        """
        self.reserve.release()
        self.metadata.update(status=ProfileStatus.INTERRUPTED.value, error=error)
        try:
            write_json_atomic(self.paths["metadata"], self.metadata, self.fix)
        except StorageError:
            return False
        return True


def _describe(setting: str, value: Any) -> str:
    """A setting as one short phrase (a training setup by its loss and optimizer, not its whole config)."""
    if setting == "training" and isinstance(value, dict):
        return (f"loss {value.get('loss', {}).get('name')}, optimizer {value.get('optimizer', {}).get('name')} "
                f"{value.get('optimizer', {}).get('config', {})}")
    return repr(value)


def finalize(store: ProfileStore) -> Profile:
    """Sort summary.csv, add the derived Σ-per-layer columns to model.csv, mark the profile complete.

    Returns the finished profile, so the caller does not read the directory again.
    """
    profile = load_profile(store.directory)
    if not profile.summary.empty:
        profile.summary = in_layer_order(profile.summary, profile.layer_names)
        write_csv_atomic(profile.summary, store.paths["summary"], store.fix)
    if not profile.model.empty:
        profile.model = with_layer_sums(profile.summary, profile.model)
        write_csv_atomic(profile.model, store.paths["model"], store.fix)
    store.finish(ProfileStatus.COMPLETE)
    profile.metadata = dict(store.metadata)
    return profile


def _resumed_metadata(old: Profile, metadata: dict[str, Any]) -> dict[str, Any]:
    """The unfinished profile's metadata updated by this run's, running again, one more resume counted."""
    merged = dict(old.metadata)
    merged.update({k: v for k, v in metadata.items() if k not in ("layers", "graph")})
    for key in ("layers", "graph"):  # the structure measured first stays (a rebuilt profile captures it anew)
        structure = old.metadata.get(key) or metadata.get(key)
        if structure:
            merged[key] = structure
    analysis = old.analysis
    if "kernel_rules" in metadata and len(analysis) and "kernels" in analysis and analysis["kernels"].notna().any():
        merged["kernel_rules"] = min(old.meta.kernel_rules or 1, metadata["kernel_rules"])  # the oldest reading kept
    merged["resumed"] = int(old.meta.resumed or 0) + 1
    merged["status"] = ProfileStatus.RUNNING.value
    merged.pop("error", None)
    return merged
