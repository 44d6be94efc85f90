"""Two profiles compared: what got slower or faster beyond noise, per layer, device and batch, and whole.

``diff(base, new)`` returns a ``Diff``: its ``cells`` (the whole model and every layer on each
device and batch size both measured, with the change in time and cost per sample and a verdict
from the raw samples, see ``tbs.compare.verdict``), the layer matching (same, renamed, added,
removed), what only one side measured, predicted cells compared apart, and the header's notes.
Nothing here measures, renders or writes: renderers are in ``tbs.report.diff``, exit codes in the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tbs.compare import settings
from tbs.compare.cells import batches_of, common_shift, compare_cells, compare_predicted, devices_of, judge, only
from tbs.compare.layers import match_layers
from tbs.errors import TbsError
from tbs.profiles.profile import Profile

GATES = ("all", "model")  # what a regression may be: any cell, or only the whole model


@dataclass
class Side:
    """What the header says of one profile."""

    directory: Path
    model: str
    mode: str
    backend: str
    host: str
    started: str | None
    status: str | None


@dataclass
class Diff:
    """BASE against NEW. ``cells``: one row per compared cell (``target`` model or layer); ``layers``: how
    each layer was matched; ``predicted``: cells both sides predicted; the rest say what only one side has."""

    base: Side
    new: Side
    cells: pd.DataFrame
    layers: pd.DataFrame
    predicted: pd.DataFrame
    devices: list[str]  # compared
    batch_sizes: list[int]  # compared
    devices_only: dict[str, list[str]] = field(default_factory=dict)  # "base"/"new" -> devices only it measured
    batch_sizes_only: dict[str, list[int]] = field(default_factory=dict)
    different_machines: bool = False  # the common devices are other hardware: devices compared, not versions
    notes: list[str] = field(default_factory=list)
    threshold: float = 0.10
    confidence: float = 0.95
    gate: str = "all"

    @property
    def regressions(self) -> pd.DataFrame:
        """The cells that fail the gate: slower beyond noise by more than ``threshold``, or newly failing."""
        gated = self.cells[self.cells["regression"].astype(bool)]
        return gated[gated["target"] == "model"] if self.gate == "model" else gated

    @property
    def regressed(self) -> bool:
        return not self.regressions.empty

    def __repr__(self) -> str:
        counts = self.cells["verdict"].value_counts().to_dict() if len(self.cells) else {}
        shown = ", ".join(f"{n} {verdict}" for verdict, n in counts.items()) or "no cells"
        return (f"<tbs.Diff {self.base.directory} -> {self.new.directory}: {len(self.cells)} cells ({shown}); "
                f"{'REGRESSED' if self.regressed else 'no regression'} beyond {self.threshold:.0%}>")


def _side(profile: Profile) -> Side:
    return Side(profile.directory, profile.name, profile.mode, profile.backend, profile.hostname,
                profile.meta.started, profile.meta.status)


def diff(base: Profile, new: Profile, *, threshold: float = 0.10, confidence: float = 0.95, force: bool = False,
         gate: str = "all") -> Diff:
    """Compare ``new`` against ``base``; refuses (TbsError) profiles whose settings differ, unless ``force``."""
    found = settings.mismatches(base, new)
    if found and not force:
        raise TbsError(settings.refusal(base, new, found))
    devices = [d for d in devices_of(new) if d in set(devices_of(base))]
    batches = [b for b in batches_of(new) if b in set(batches_of(base))]
    matches = match_layers(base, new)
    cells = judge(compare_cells(base, new, matches, devices, batches, confidence), confidence, threshold)
    different, machine = settings.machine_notes(base, new, devices)
    shift = common_shift(cells)
    machine += [shift] if shift else []
    return Diff(
        base=_side(base), new=_side(new), cells=cells, layers=matches,
        predicted=compare_predicted(base, new, matches), devices=devices, batch_sizes=batches,
        devices_only={"base": only(devices_of(base), devices), "new": only(devices_of(new), devices)},
        batch_sizes_only={"base": only(batches_of(base), batches), "new": only(batches_of(new), batches)},
        different_machines=different, notes=machine + settings.other_notes(base, new, found),
        threshold=threshold, confidence=confidence, gate=gate)
