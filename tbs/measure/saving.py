"""A finished cell to disk: its row (with its programs' analysis and peak memory), its samples, its
ops traced in context, and the rows of the cells that share its programs (``dedupe``).

Each save updates the estimate of what is left and the progress line.
"""

from __future__ import annotations

from typing import Any

from tbs.measure import analysis, rows
from tbs.measure.dedupe import find_shared, shared_row
from tbs.measure.rows import Cell
from tbs.schema import MEASURED


class CellSaving:
    """Mixed into ``Profiler``: it lends ``request``, ``store``, ``progress``, ``timer``, ``eta``, ``costs``,
    ``peaks``, ``saved`` and ``followers``."""

    def _share(self, pending: dict[tuple, Cell]) -> None:
        """Cells that repeat an earlier one's programs leave ``pending``: the representative's row is theirs too."""
        shared = find_shared(pending, lambda key: pending[key].signature)
        for duplicate, representative in shared.of.items():
            self.followers.setdefault(representative, []).append((duplicate, pending.pop(duplicate).base))
            self.eta.finished(duplicate)  # nothing of its own to measure

    def _trace(self, key: tuple, cell: Cell) -> list[dict[str, Any]]:
        """The whole model's few traced calls (after its samples, never among them), as ops.csv rows.

        A trace that fails or that the backend cannot take leaves the cell measured, with the reason in
        the metadata's ``in_context``; its layers' in-model columns stay blank.
        """
        if cell.trace is None or not self.request.in_context:
            return []
        where = f"{key.device}@{key.batch_size}"
        self.progress.describe(f"tracing {cell.label} in context")
        started = self.timer.clock()
        try:
            found = cell.trace()
        except Exception as exc:  # the cell is measured all the same
            found, reason = None, rows.reason(exc)
        else:
            reason = "" if found else "this backend's profiler names no op of the compiled model here"
        seconds = self.timer.clock() - started
        record = ({"tool": found[0]["tool"], "calls": sum(r["kind"] == "call" for r in found), "seconds": seconds}
                  if found else {"reason": reason, "seconds": seconds})
        self.store.metadata.setdefault("in_context", {})[where] = record
        return found or []

    def _save(self, key: tuple, row: dict[str, Any], samples: list[dict[str, Any]], label: str,
              ops: list[dict[str, Any]] = ()) -> None:
        """Write a finished cell (with its programs' analysis) to disk, then update the estimate of what is left.

        Cells that share its programs (``dedupe``) get its row under their own names, with ``shared_with``.
        """
        for duplicate, base in self.followers.pop(key, []):
            self._save_one(duplicate, shared_row(row, base, key.layer), [], label, costs=self.costs.get(key))
        self._save_one(key, row, samples, label, ops=ops)

    def _save_one(self, key: tuple, row: dict[str, Any], samples: list[dict[str, Any]], label: str,
                  costs: dict[str, Any] | None = None, ops: list[dict[str, Any]] = ()) -> None:
        costs = costs if costs is not None else self.costs.pop(key, None)
        if costs:
            row = dict(row, **analysis.row_columns(costs, key.target == "model"))
        peak = self.peaks.pop(key, None)
        if peak is not None and row.get("status") in MEASURED:
            try:
                row["peak_bytes"] = peak()
            except Exception:  # one more call for its memory failed: no figure, the cell stays measured
                row["peak_bytes"] = None
        shared = "shared_with" in row  # the representative's programs: analysed once, under its name
        self.store.add_cell(key, self.request.price_row(row), samples,
                            analysis.analysis_rows(key, costs) if costs and not shared else [], ops=list(ops))
        self.saved.append((key, row))
        self.eta.finished(key, row.get("median_s"), row.get("n"))
        self.progress.advance(label, self.eta.remaining_seconds)
