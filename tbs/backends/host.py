"""The machine itself (CPU, memory, host name) and what a profile records about it.

Neutral: each backend adds its own versions and settings in its ``environment`` module.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import sys
import tempfile
from contextlib import contextmanager
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, Iterator

_PACKAGES = ("tbs", "keras", "numpy", "pandas", "scipy", "plotly", "click", "cloudpickle")


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo (or platform on other systems)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Python's and the installed packages' versions (a backend adds its own)."""
    versions = {"python": sys.version.split()[0]}
    for name in _PACKAGES + extra:
        try:
            versions[name] = _metadata.version(name)
        except _metadata.PackageNotFoundError:
            continue
    return versions


def common_settings() -> dict[str, Any]:
    """Threading settings every backend shares (they change timings, so they travel with them)."""
    return {"cpu_count": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _status_bytes(field: str) -> int | None:
    """A size from /proc/self/status (``VmHWM``, ``VmData``...), in bytes; None where the system has none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_peak_bytes(reset: bool = False) -> int | None:
    """This process's peak resident memory (VmHWM), the host CPU's only peak counter.

    ``reset`` restarts it first (Linux: writing 5 to /proc/self/clear_refs), so the peak
    is that of what runs next. None where the system keeps no such counter.
    """
    if reset:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return None
    return _status_bytes("VmHWM")


def memory_headroom_bytes() -> int | None:
    """What this process may still allocate: free memory, or less where a limit is set on it.

    A data-size limit (``ulimit -d``, RLIMIT_DATA) makes allocations beyond it fail, so
    the headroom is the smaller of MemAvailable and what that limit leaves.
    """
    free = available_memory_bytes()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    except (ImportError, OSError, ValueError):
        return free
    used = _status_bytes("VmData")
    if soft == resource.RLIM_INFINITY or used is None:
        return free
    left = max(int(soft) - used, 0)
    return left if free is None else min(free, left)


@contextmanager
def native_stderr_captured() -> Iterator[None]:
    """Hold back what native code writes to fd 2 (absl's pre-init log lines, CUDA probing); replay it on failure."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (e.g. some test runners)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))
