"""The cell loop of one (batch, device) group: compile and warm up every pending cell's programs, then
sample them all in interleaved rounds, saving each cell once all its phases are measured.

A failing cell is recorded and the loop goes on; a training group too large for memory is sampled in chunks.
"""

from __future__ import annotations

import gc
from typing import Any

from tbs.backends.base import Device
from tbs.backends.host import memory_headroom_bytes
from tbs.capture.recorder import Capture
from tbs.measure import analysis, rows
from tbs.measure.capacity import measured_peak
from tbs.measure.rows import Cell
from tbs.measure.timing import Interleaved, Interrupted, Measurement, Runner
from tbs.measure.train_cells import memory_chunks
from tbs.schema import MEASURED, Status


class GroupSampling:
    """Mixed into ``Profiler``: it lends ``request``, ``store``, ``progress``, ``timer``, ``eta``, ``should_stop``,
    ``costs``, ``analysed``, ``peaks``, ``restorers``, and its ``_harness``, ``_pending_cells``, ``_share``,
    ``_save`` and ``_trace``."""

    def _compile_cells(self, sampler: Interleaved, pending: dict[tuple, Cell], device: Device) -> dict[tuple, int]:
        """Compile and warm up each pending cell's programs; one that cannot run is recorded now and dropped.

        Returns how many programs (phases) each remaining cell has.
        """
        phases: dict[tuple, int] = {}
        for key, cell in list(pending.items()):
            if self.should_stop():
                raise Interrupted()
            unsupported = device.unsupported_reason(self.request.tensors_fn(cell.data))
            if unsupported:  # recorded, not dropped: the report says why this cell has no time
                self._save(key, dict(cell.base, status=Status.UNSUPPORTED.value, reason=unsupported), [], cell.label)
                del pending[key]
                continue
            self.progress.describe(f"warming up {cell.label}")
            try:
                programs = cell.programs()
                added = self._add_programs(sampler, key, cell, programs)
            except Interrupted:
                raise
            except Exception as exc:  # a failing layer is recorded and the run goes on
                self._save(key, rows.failed_row(cell.base, exc), [], cell.label)
                del pending[key]
                continue
            phases[key] = added
            if cell.analyse is not None and self.request.analysis:
                self.costs[key] = analysis.analysed(cell.analyse, cell.call, next(iter(programs)), self.analysed,
                                                    cell.signature, len(programs))
            # An accelerator's allocator peak, after one more call once sampled. Not the host's: its
            # allocators keep freed memory resident, so a warm call shows no growth at all.
            if key.target == "model" and device.kind != "cpu":
                self.peaks[key] = lambda runner=next(iter(programs.values())): measured_peak(device, runner)
        return phases

    def _add_programs(self, sampler: Interleaved, key: tuple, cell: Cell, programs: dict[str, Runner]) -> int:
        """Calibrate the cell's programs into ``sampler`` (single calls: of the first); how many were added.

        A ``several_calls_only`` phase is left out where one call of the first program fills a sample.
        """
        first_iterations: int | None = None
        added = 0
        for phase, runner in programs.items():
            if first_iterations == 1 and phase in cell.several_calls_only:
                continue
            iterations = sampler.add((key, phase), runner, cell.single_calls if first_iterations is None else 0,
                                     cell.amortise_fixed)
            first_iterations = iterations if first_iterations is None else first_iterations
            added += 1
            self.restorers.extend([runner.restore] if hasattr(runner, "restore") else [])
        return added

    def _measure_group(self, device: Device, batch: int, cap: Capture, inputs: Any, copy_seconds: float,
                       input_bytes: int, model_key: tuple) -> None:
        """Compile every unmeasured cell of (batch, device), then sample them all in rounds.

        A training group whose programs would not fit in memory together is sampled in chunks,
        the whole train step with the first (each chunk's memory is freed before the next).
        """
        pending = self._pending_cells(device, batch, cap, inputs, copy_seconds, input_bytes, model_key)
        if self.request.dedupe:
            self._share(pending)
        self.eta.begin_group(pending)
        free = memory_headroom_bytes() if self.request.training and device.kind == "cpu" else None
        chunks, too_big = memory_chunks(pending, cap, model_key, free, device.train_step_memory_factor)
        for key, need in too_big.items():
            gib = f"{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB is available" if free else ""
            self._save(key, rows.failed_row(pending[key].base, MemoryError(
                f"out of memory: its training programs need about {gib}")), [], pending[key].label)
        for number, chunk in enumerate(chunks):
            sampler = Interleaved(self.timer, self._harness(device))
            try:
                phases = self._compile_cells(sampler, chunk, device)
                self._sample(sampler, chunk, phases, device, batch)
            finally:
                for restore in self.restorers:  # a timed train step changed the model's weights: put them back
                    restore()
                self.restorers.clear()
            chunk.clear()  # the chunk's programs and the residuals they hold go before the next is compiled
            if number < len(chunks) - 1:
                gc.collect()
        self.eta.end_group()
        overhead = sampler.overhead
        self.store.metadata.setdefault("harness_overhead", {})[f"{device.name}@{batch}"] = {
            "per_call_s": overhead.per_call_seconds, "per_iteration_s": overhead.per_iteration_seconds}
        if len(chunks) > 1:
            self.store.metadata.setdefault("sampled_in_chunks", {})[f"{device.name}@{batch}"] = len(chunks)
        self.store.update_metadata()

    def _sample(self, sampler: Interleaved, pending: dict[tuple, Cell], phases: dict[tuple, int],
                device: Device, batch: int) -> None:
        """Sample every program in rounds; a cell is saved once all its phases are measured.

        A whole model traced in context is saved once every cell of the group is sampled: its trace
        (another compile, the profiler) then runs beside no other cell's samples.
        """
        parts: dict[tuple, dict[str, Measurement]] = {key: {} for key in pending}
        total = len(pending)
        traced_later: list[tuple[tuple, Cell, dict[str, Any], list[dict[str, Any]]]] = []

        def done(sub: tuple, m: Measurement) -> None:
            key, phase = sub
            if key not in parts:  # another phase of this cell failed: already recorded
                return
            parts[key][phase] = m
            if len(parts[key]) == phases[key]:
                cell, measured = pending[key], parts.pop(key)
                samples = [s for p, pm in measured.items()
                           for s in rows.sample_rows(cell.target, key[1], pm, cell.base, p)]
                row = cell.build(measured)
                if cell.trace is not None and self.request.in_context and row.get("status") in MEASURED:
                    traced_later.append((key, cell, row, samples))
                else:
                    self._save(key, row, samples, cell.label)

        def failed(sub: tuple, exc: BaseException) -> None:
            key, phase = sub
            if parts.pop(key, None) is not None:
                cell = pending[key]
                row = rows.failed_row(cell.base, exc)
                if len(phases) and self.request.training:
                    row["reason"] = f"{phase}: {row['reason']}"
                self._save(key, row, [], cell.label)

        def round_done(active: int) -> None:
            self.progress.advance(f"sampling {total} cells on {device.name} @ batch {batch}: {active} left",
                                  self.eta.remaining_seconds)

        self.progress.describe(f"sampling {total} cells on {device.name} @ batch {batch}")
        finished = False
        try:
            sampler.run(on_done=done, on_error=failed, on_round=round_done)
            finished = True
        finally:  # stopped (Ctrl-C): what was measured is saved, untraced
            for key, cell, row, samples in traced_later:
                self._save(key, row, samples, cell.label, ops=self._trace(key, cell) if finished else [])
