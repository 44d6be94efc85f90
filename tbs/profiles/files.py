"""Writing a profile's files so that no disk problem costs a measured row or leaves a half-written one.

- Whole files are replaced atomically (a temporary file, then a rename): a full or read-only
  disk leaves the old file as it was, the temporary one is removed, and the caller gets one
  ``StorageError`` line naming the file and the fix.
- Rows are appended as cells finish; an append that fails is cut back to where it started, so
  no partial row stays behind.
- A measuring run keeps a small reserve file: when the disk fills, deleting it frees just
  enough room to mark the profile interrupted (so ``--resume`` knows what it holds).
- Nothing is ever deleted to make room: an old profile in the way is moved aside.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from tbs.errors import StorageError

WRITABLE = "free space, or choose a writable directory"
RESERVE_FILE = ".reserve"
RESERVE_MIN_BYTES = 16 * 1024


@contextmanager
def no_interrupts() -> Iterator[None]:
    """Hold Ctrl-C until a file write is complete, so no row is ever half-written."""
    blockable = hasattr(signal, "pthread_sigmask")
    if blockable:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if blockable:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _replace(path: Path, tmp: Path, write: Any, fix: str) -> None:
    try:
        write(tmp)
        with no_interrupts():
            os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise StorageError(path, exc, fix) from None


def write_csv_atomic(frame: pd.DataFrame, path: Path, fix: str = WRITABLE) -> None:
    _replace(path, path.with_suffix(".csv.tmp"), lambda tmp: frame.to_csv(tmp, index=False), fix)


def write_json_atomic(path: Path, data: Any, fix: str = WRITABLE) -> int:
    """Returns the file's size in bytes (the reserve keeps room for it)."""
    text = json.dumps(data, indent=2, default=str)
    _replace(path, path.with_suffix(".json.tmp"), lambda tmp: tmp.write_text(text), fix)
    return len(text.encode())


def write_text_atomic(path: Path, text: str, fix: str = WRITABLE) -> None:
    _replace(path, path.with_name(path.name + ".tmp"), lambda tmp: tmp.write_text(text, encoding="utf-8"), fix)


def append_rows(frame: pd.DataFrame, path: Path, fix: str = WRITABLE) -> None:
    """Append rows (with a header if the file is new); a failed append leaves the file as it was."""
    with no_interrupts():
        size = path.stat().st_size if path.exists() else 0
        try:
            frame.to_csv(path, mode="a", header=size == 0, index=False)
        except OSError as exc:
            try:
                os.truncate(path, size)  # the partial row goes: its cell was not finished
            except OSError:
                pass
            raise StorageError(path, exc, fix) from None


class Reserve:
    """A few KiB held on the profile's disk while it is measured, given back when the disk fills."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / RESERVE_FILE
        self.size = 0

    def hold(self, metadata_bytes: int, fix: str = WRITABLE) -> None:
        """Enough room to rewrite the metadata twice over (the atomic write holds two copies)."""
        want = max(RESERVE_MIN_BYTES, 2 * metadata_bytes + RESERVE_MIN_BYTES // 2)
        if want <= self.size:
            return
        try:
            with open(self.path, "wb") as handle:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(handle.fileno(), 0, want)
                else:  # pragma: no cover - platforms without fallocate: real bytes
                    handle.write(b"\0" * want)
        except OSError as exc:
            raise StorageError(self.path, exc, fix) from None
        self.size = want

    def release(self) -> None:
        """Free the room (when the disk is full, or the run is over)."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        self.size = 0


def set_aside(directory: Path, names: list[str]) -> Path | None:
    """Move the files ``names`` of an old profile into a new sibling directory; returns it (None: nothing there).

    tbs never deletes measured rows: a new profile written where an old one lies moves the old one here.
    """
    present = [directory / n for n in names if (directory / n).is_file() and (directory / n).stat().st_size]
    if not present:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.previous-{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = directory.with_name(f"{directory.name}.previous-{stamp}-{suffix}")
    fix = "move the old profile away yourself, or choose another --out"
    try:
        target.mkdir(parents=True)
    except OSError as exc:
        raise StorageError(target, exc, fix) from None
    for path in present:
        try:
            shutil.move(path, target / path.name)  # a rename, or a copy where the sibling is on another disk
        except OSError as exc:
            raise StorageError(target / path.name, exc, fix) from None
    return target
