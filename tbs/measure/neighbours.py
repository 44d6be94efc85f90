"""Other tbs runs measuring on this machine: their load skews every timing taken meanwhile.

Each measuring process holds an exclusive lock on a file of its own in a shared
folder for as long as it measures; a file whose lock can be taken belongs to a
process that has ended and is cleared. Locks are the kernel's (flock), so a run
that is killed never leaves a stale claim.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

REGISTRY = Path(tempfile.gettempdir()) / "tbs-measuring"


class Registration:
    """This process, registered as measuring ``what`` until ``close``."""

    def __init__(self, what: str, registry: Path = REGISTRY) -> None:
        self.path = registry / f"{os.getpid()}.run"
        self.handle: IO[str] | None = None
        try:
            registry.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "w")
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            handle.write(f"process {os.getpid()} measuring {what}")
            handle.flush()
            self.handle = handle
        except OSError:  # a registry we cannot write only loses the warning, never the run
            self.handle = None

    def close(self) -> None:
        if self.handle is not None:
            self.path.unlink(missing_ok=True)
            self.handle.close()
            self.handle = None


def others(registry: Path = REGISTRY) -> list[str]:
    """What every other live tbs process on this machine is measuring (stale claims are cleared)."""
    found = []
    for path in sorted(registry.glob("*.run")) if registry.is_dir() else []:
        if path.stem == str(os.getpid()):
            continue
        try:
            with open(path) as handle:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # held: that process is alive and measuring
                    found.append(handle.read().strip() or f"process {path.stem}")
                    continue
            path.unlink(missing_ok=True)  # nobody holds it: that process has ended
        except OSError:
            continue
    return found
