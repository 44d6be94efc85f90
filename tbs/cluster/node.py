"""The task that runs on one node of a group: tbs's own profiler, in-process, streaming every cell.

The model file arrives as bytes through Ray's object store (no shared file system), is written
to a temporary directory there and profiled exactly as ``tbs profile`` does. A ``StreamingStore``
writes each finished cell locally and puts it on a Ray queue the driver drains as it goes, so a
node that dies loses at most the cell it was measuring. Cells the driver already has are passed
in and skipped (a retry on another node of the group, or ``--resume``).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tbs.profiles.store import ProfileStore
from tbs.schema import CellKey

if TYPE_CHECKING:
    from tbs.run import RunOptions


class StreamingStore(ProfileStore):
    """A profile store that also sends every cell, transfer and metadata update to the driver."""

    def __init__(self, directory: Path, queue: Any, group: str, done: list[tuple]) -> None:
        super().__init__(directory)
        self.queue, self.group, self.already = queue, group, {CellKey(*k) for k in done}

    def is_done(self, key: CellKey) -> bool:
        return key in self.already or super().is_done(key)

    def add_cell(self, key: CellKey, row: dict[str, Any], samples: list[dict[str, Any]],
                 analysis: list[dict[str, Any]] = (), ops: list[dict[str, Any]] = ()) -> None:
        super().add_cell(key, row, samples, analysis, ops)
        self.queue.put(("cell", self.group, tuple(key), row, samples, list(analysis), list(ops)))

    def add_transfers(self, rows: list[dict[str, Any]]) -> None:
        super().add_transfers(rows)
        self.queue.put(("transfers", self.group, rows))

    def update_metadata(self, **values: Any) -> None:
        super().update_metadata(**values)
        self.queue.put(("metadata", self.group, dict(self.metadata)))


def _warn(message: str) -> None:
    """A node's warnings (a device skipped, a guessed input shape) go to its Ray worker log."""
    import warnings

    from tbs.errors import TbsWarning

    warnings.warn(message, TbsWarning, stacklevel=2)


def _written(scratch: Path, files: dict[str, bytes]) -> dict[str, Path]:
    """Files that travelled as bytes, written under their own names in this node's scratch directory."""
    out = {}
    for name, data in files.items():
        path = scratch / "files" / Path(name).name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        out[name] = path
    return out


def profile_here(model_bytes: bytes, model_suffix: str, options: RunOptions, queue: Any, group: str,
                 done: list[tuple], files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Profile the model on this node's devices; returns the node's final metadata.

    ``files`` are the --input data and --custom-objects files by their driver-side path; the
    options naming them are pointed at this node's copies.
    """
    from tbs.progress import reporter
    from tbs.run import Run

    with tempfile.TemporaryDirectory(prefix="tbs-node-") as scratch:
        model = Path(scratch) / f"model{model_suffix}"
        model.write_bytes(model_bytes)
        copies = _written(Path(scratch), files or {})
        options = dataclasses.replace(
            options, model=model, out=Path(scratch) / "profile", resume=False,
            input=None if options.input is None else copies[str(options.input)],
            custom_objects=[copies[str(p)] for p in options.custom_objects] if options.custom_objects else None)
        def progress(label: str, remaining_seconds: float | None) -> None:
            queue.put(("progress", group, label, remaining_seconds))

        run = Run(options, reporter(progress), warn=_warn)
        run.prepare()
        store = StreamingStore(Path(scratch) / "profile", queue, group, done)
        run.start(store)
        import ray

        store.update_metadata(node_id=ray.get_runtime_context().get_node_id())  # where it really ran
        try:
            run.measure(store, should_stop=lambda: False)
        finally:
            run.close()
        return dict(store.metadata, status="complete")
