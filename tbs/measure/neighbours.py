"""Other tbs runs measuring on this machine: their load skews every timing taken meanwhile.

Each measuring process holds an exclusive lock on a file of its own in a shared
folder for as long as it measures; a file whose lock can be taken belongs to a
process that has ended and is cleared. Locks are the kernel's (flock), so a run
that is killed never leaves a stale claim.

The folder is shared by every user of the machine (world-writable with the sticky
bit, like /tmp itself: anyone may add a file, only its owner may remove it), since
another user's run skews timings just as much. Files are created readable by all,
so others can test their locks. A file of another user that cannot be opened all
the same is counted as a live run: we cannot tell, and a needless warning costs
less than timings silently skewed.

POSIX only: without ``fcntl`` (Windows) nothing registers and no run is reported.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, IO

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - Windows: no flock, so no warning (see the module docstring)
    _fcntl = None  # type: ignore[assignment]

REGISTRY = Path(tempfile.gettempdir()) / "tbs-measuring"
SHARED_FOLDER_MODE = 0o1777  # every user may register; the sticky bit keeps each user's files their own
FILE_MODE = 0o644  # others may open it to test its lock
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # never write or read through a link another user planted


def _shared_folder(registry: Path) -> None:
    """Create the folder open to every user (chmod after mkdir: mkdir's mode is cut by the umask)."""
    registry.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(registry, SHARED_FOLDER_MODE)
    except OSError:  # another user's folder: already shared, or theirs to fix
        pass


class Registration:
    """This process, registered as measuring ``what`` until ``close``."""

    def __init__(self, what: str, registry: Path = REGISTRY) -> None:
        self.path = registry / f"{os.getpid()}.run"
        self.handle: IO[str] | None = None
        if _fcntl is None:
            return
        try:
            _shared_folder(registry)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, FILE_MODE)
        except OSError:  # a registry we cannot write only loses the warning, never the run
            return
        handle = os.fdopen(fd, "w")
        try:
            os.fchmod(fd, FILE_MODE)  # os.open's mode is cut by the umask too
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            handle.truncate(0)  # only once locked: a live holder's text stays (pid namespaces share /tmp)
            handle.write(f"process {os.getpid()} measuring {what}")
            handle.flush()
        except OSError:
            handle.close()
            return
        self.handle = handle

    def close(self) -> None:
        if self.handle is not None:
            self.path.unlink(missing_ok=True)
            self.handle.close()
            self.handle = None


def _claim(path: Path) -> str | None:
    """What the run behind one registry file measures, or None if that run has ended."""
    if _fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except PermissionError:  # another user's file we may not read: it may be live, so count it
        try:
            foreign = path.lstat().st_uid != os.getuid()
        except OSError:
            return None
        return f"process {path.stem} of another user" if foreign else None
    except OSError:  # gone meanwhile, or a link: no claim
        return None
    with os.fdopen(fd) as handle:
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except OSError:  # held: that process is alive and measuring
            return handle.read().strip() or f"process {path.stem}"
        try:
            path.unlink(missing_ok=True)  # nobody holds it: that process has ended
        except OSError:  # another user's stale file (the sticky bit keeps it theirs): ended all the same
            pass
    return None


def others(registry: Path = REGISTRY) -> list[str]:
    """What every other live tbs process on this machine is measuring (stale claims are cleared)."""
    if _fcntl is None:
        return []
    found = []
    for path in sorted(registry.glob("*.run")) if registry.is_dir() else []:
        if path.stem == str(os.getpid()):
            continue
        claim = _claim(path)
        if claim is not None:
            found.append(claim)
    return found


def register(what: str, warn: Callable[[str], None]) -> Registration:
    """Warn about every other live tbs run on this machine, then register this one as measuring ``what``."""
    for other in others():
        warn(f"another tbs run is measuring on this machine ({other}); its load skews every timing here")
    return Registration(what)
