"""User-facing errors: what went wrong and how to fix it, in one line.

The CLI turns every TbsError into a single stderr line and exit code 2, so a
user's mistake never ends in a traceback.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path


class TbsError(Exception):
    """A problem the user can fix; the message names the bad value and the fix."""


class ModelLoadError(TbsError):
    """The model file is missing, corrupt, not a Keras model, or needs custom classes."""


class InputDataError(TbsError):
    """The --input data does not fit the model's inputs."""


class DeviceError(TbsError):
    """None of the requested devices can be used."""


class ProfileError(TbsError):
    """A profile directory is missing, unfinished, or belongs to another model."""


class StorageError(ProfileError):
    """A file could not be written (a full or read-only disk, no permission); what was measured stays."""

    def __init__(self, path: os.PathLike[str] | str, exc: OSError, fix: str) -> None:
        self.path, self.errno = Path(path), exc.errno
        super().__init__(f"cannot write '{path}' ({describe_os_error(exc)}); {fix}")


def describe_os_error(exc: OSError) -> str:
    """An OSError in a few words a user knows (the disk is full, read-only, ...)."""
    import errno

    known = {errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system",
             errno.EACCES: "permission denied", errno.EPERM: "permission denied",
             errno.EDQUOT: "disk quota exceeded"}
    return known.get(exc.errno, exc.strerror or type(exc).__name__)


class TbsWarning(UserWarning):
    """Something the user should know that does not stop the run (a device skipped, a guessed shape).

    The CLI prints each as one ``Warning: ...`` line; in Python they are ordinary warnings.
    """


def caller_stacklevel() -> int:
    """The stacklevel that points a warning at the first frame outside the tbs package."""
    package = str(Path(__file__).resolve().parent) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str) -> None:
    """A TbsWarning pointed at the caller's own code (the CLI prints it as one ``Warning:`` line)."""
    warnings.warn(message, TbsWarning, stacklevel=caller_stacklevel())
