"""How a long run reports itself: a terminal bar with an honest ETA, a callback, or nothing.

The profiler reports cells as they finish with its estimate of the seconds left
(``measure.profiler.Progress``); a ``Reporter`` adds one-off notes (resuming,
stopping) and transient status lines (loading). ``tbs.profile(progress=...)``
takes "auto" (a bar when stderr is a terminal), None/False (nothing), "bar", or
a function ``f(label, remaining_seconds)``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from tbs.measure.request import Progress

ProgressCallback = Callable[[str, "float | None"], None]


class Reporter(Progress):
    """Silent by default: what tests and scripts that asked for no progress get."""

    def note(self, message: str) -> None:
        """A line worth keeping (resuming, stopping)."""

    def status(self, message: str) -> None:
        """A transient line (loading ...), replaced by the next; empty clears it."""


class TerminalProgress(Reporter):
    """A click progress bar measured in seconds of real work, so its ETA is honest.

    Its position is the time spent so far and its length that plus the profiler's
    current estimate of what is left, so click's ETA is that estimate.
    """

    def __init__(self) -> None:
        self.bar: Any = None
        self.label = ""
        self.last = time.perf_counter()

    def start(self, remaining_seconds: float) -> None:
        import click

        self.status("")
        self.last = time.perf_counter()
        self.bar = click.progressbar(
            length=max(int(remaining_seconds * 1000), 1), label="measuring", file=sys.stderr,
            show_eta=True, show_percent=True, width=24,
            item_show_func=lambda _: self.label[:60] if self.label else None,
        )
        self.bar.__enter__()

    def describe(self, label: str) -> None:
        self.label = label
        if self.bar is not None:
            self.bar.update(0, label)

    def advance(self, label: str, remaining_seconds: float) -> None:
        now = time.perf_counter()
        elapsed_ms, self.last = int((now - self.last) * 1000), now
        if self.bar is None:
            return
        self.bar.length = max(self.bar.pos + elapsed_ms + int(remaining_seconds * 1000), 1)
        self.bar.update(elapsed_ms, label)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        self.status("")

    def note(self, message: str) -> None:
        self.status("")
        print(message, file=sys.stderr, flush=True)

    def status(self, message: str) -> None:
        """Erased by the next one, so errors stay one line; only on a terminal."""
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K" + message)
            sys.stderr.flush()


class CallbackProgress(Reporter):
    """Calls ``f(label, remaining_seconds)`` as cells finish (remaining is None for a plain label)."""

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback

    def start(self, remaining_seconds: float) -> None:
        self.callback("measuring", remaining_seconds)

    def describe(self, label: str) -> None:
        self.callback(label, None)

    def advance(self, label: str, remaining_seconds: float) -> None:
        self.callback(label, remaining_seconds)

    def note(self, message: str) -> None:
        self.callback(message, None)


def reporter(progress: Any) -> Reporter:
    """The Reporter for a ``progress=`` argument."""
    if isinstance(progress, Reporter):
        return progress
    if progress in (None, False):
        return Reporter()
    if progress == "auto":
        return TerminalProgress() if sys.stderr.isatty() else Reporter()
    if progress in ("bar", True):
        return TerminalProgress()
    if callable(progress):
        return CallbackProgress(progress)
    from tbs.errors import TbsError

    raise TbsError(f"progress={progress!r}: use 'auto', 'bar', None, or a function f(label, remaining_seconds)")
