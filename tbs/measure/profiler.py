"""Measure every cell: each leaf layer, and the whole model, on each device and batch size.

Order: batch sizes ascending, then devices. For each (batch, device) the model
input is copied to the device (timed: a fixed cost), one eager pass captures every
layer's real arguments, then each layer and the whole compiled forward pass are
timed the same blocked, amortised way. Each finished cell goes straight to disk.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import numpy as np

from tbs.capture.recorder import Capture
from tbs.errors import TbsError
from tbs.measure import analysis, headroom, rows
from tbs.measure.calibrate import calibrate_devices, model_dtypes
from tbs.measure.capacity import all_capacities, measured_peak
from tbs.measure import transfers
from tbs.measure.eta import WorkEstimate
from tbs.backends.base import Device
from tbs.backends.host import memory_headroom_bytes
from tbs.load.inputs import structure_inputs
from tbs.load.train_setup import fit_to_outputs
from tbs.measure.parts import InParts
from tbs.measure.dedupe import find_shared, shared_row
from tbs.measure.rows import Cell
from tbs.measure.inference import InferenceCells
from tbs.measure.structure import record_skipped, record_structure
from tbs.measure.train_cells import TrainingCells, memory_chunks
from tbs.measure.request import CellSink, ProfileRequest, Progress
from tbs.schema import LOSS_LAYER, MEASURED, MODEL_LAYER, CellKey, Status
from tbs.backends.tensors import tensor_bytes
from tbs.measure.timing import Interleaved, Interrupted, Measurement, Runner, Timer

class Profiler(InParts):
    def __init__(self, request: ProfileRequest, store: CellSink, progress: Progress,
                 should_stop: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.request = request
        self.store = store
        self.progress = progress
        self.should_stop = should_stop
        self.timer = Timer(request.config, should_stop, clock)
        self.harnesses: dict[str, Runner] = {}
        self.eta = WorkEstimate(request.config, rows.SINGLE_CALLS, clock)
        self.restorers: list[Callable[[], None]] = []
        self.activation_bytes_per_sample = 0.0
        self.costs: dict[tuple, dict[str, Any]] = {}  # cell -> phase -> ProgramCost, until its row is saved
        self.analysed: dict[tuple, dict[str, Any]] = {}  # call signature -> its analysis (repeated blocks)
        self.saved: list[tuple[CellKey, dict[str, Any]]] = []  # this run's rows: the memory fit reads them
        self.first_oom: BaseException | None = None  # the first capture ran out of memory
        self.peaks: dict[tuple, Callable[[], int | None]] = {}  # a whole model's peak memory, measured at its save
        # Representative cell -> the cells that share its programs (their keys and row identities).
        self.followers: dict[tuple, list[tuple[tuple, dict[str, Any]]]] = {}

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

    # ----- rows ---------------------------------------------------------------------
    def _base_row(self, device: Device, batch: int) -> dict[str, Any]:
        r = self.request
        return {"device": device.name, "device_kind": device.kind, "batch_size": batch, "mode": r.mode, "host": r.host}

    # ----- runners ------------------------------------------------------------------
    def _harness(self, device: Device) -> Runner:
        """An empty compiled loop on the device: what the timing harness itself costs."""
        if device.name not in self.harnesses:
            self.harnesses[device.name] = device.harness(self.request.xla)
        return self.harnesses[device.name]

    def _capture(self, device: Device, batch: int) -> tuple[Capture, Any, float, int]:
        r = self.request
        model = r.model_on(device)
        host_inputs = structure_inputs(model, r.host_inputs(batch), r.specs)
        copy_seconds = float(np.median(transfers.timed_copies(device, host_inputs, clock=self.timer.clock)))
        inputs = device.place(host_inputs)
        input_bytes = sum(tensor_bytes(x) for x in r.tensors_fn(inputs))
        with device.scope():
            # The host runs everything it is given; an accelerator may hand ops back to it.
            captured = r.capture_fn(model, inputs, r.training, device, record_devices=device.kind != "cpu")
        return captured, inputs, copy_seconds, input_bytes

    @property
    def _training_setup(self) -> Any:
        """The loss and optimizer a training profile times (None in inference): the layer records gain their parts."""
        return self.request.training_setup if self.request.training else None

    def _failed_cells(self, device: Device, batch: int, exc: BaseException) -> None:
        """The forward pass itself failed: every cell of this (batch, device) gets the reason."""
        status, reason = (Status.OOM if rows.is_oom(exc) else Status.ERROR).value, rows.reason(exc)
        for layer in self.store.layers:
            key = CellKey.of("layer", layer.name, device.name, batch, self.request.mode)
            if not self.store.is_done(key):
                row = dict(self._base_row(device, batch), layer=layer.name, layer_type=layer.type,
                           category=layer.category, status=status, reason=reason)
                self._save(key, row, [], f"{layer.name} failed")
        key = CellKey.of("model", MODEL_LAYER, device.name, batch, self.request.mode)
        if not self.store.is_done(key):
            self._save(key, dict(self._base_row(device, batch), status=status, reason=reason), [], "model failed")

    def _measure_transfers(self) -> None:
        """Copy costs between every pair of profiled devices and the host (placement needs them)."""
        r = self.request
        if "transfers" in self.store.metadata or len(r.devices) < 2 and r.devices[0].kind == "cpu":
            return
        host = next((d for d in r.devices if d.kind == "cpu"), None) or r.host_device
        self.progress.describe("timing copies between devices")
        rows, fits = transfers.measure(r.devices, host)
        self.store.add_transfers(rows)
        self.store.update_metadata(transfers={k: f.as_dict() for k, f in fits.items()}, host_device=host.name)

    def run(self) -> None:
        r = self.request
        batches = sorted(r.batch_sizes)
        first: tuple[Capture, Any, float, int] | None = None
        traced = self._first_too_big(r.devices[0], batches[0])  # (records, input bytes) where one capture cannot fit
        try:
            # Captured twice: the second pass's eager times are free of first-call costs
            # (kernel and oneDNN primitive creation), so they estimate the work far better.
            if traced is None:
                self._capture(r.devices[0], batches[0])
                first = self._capture(r.devices[0], batches[0])
        except Exception as exc:
            self.first_oom = exc  # recorded for its cells, not tried again (an allocator may wait ~10 s to fail)
            if not rows.is_oom(exc):
                raise TbsError(
                    f"the model's forward pass fails on {'your --input data' if r.user_arrays is not None else 'synthetic inputs'} "
                    f"at batch {batches[0]} ({rows.reason(exc)}); check the model, or pass --input with real data"
                ) from None
        if first is not None and r.training_setup is not None:
            fit_to_outputs(r.training_setup, first[0].outputs)  # a loss that does not fit: one line, before any timing
        records, input_bytes = (first[0], first[3]) if first is not None else traced or (None, 0)
        if records is not None:
            record_structure(self.store, records, batches[0], self._training_setup if first is not None else None)
            self.eta.seed(records.calls, batches[0], r.batch_sizes, [d.name for d in r.devices], r.mode,
                          3 if r.training else 1, self.store.is_done)
            self.activation_bytes_per_sample = (sum(c.output_bytes for c in records.calls) + input_bytes) / batches[0]
        self._measure_transfers()
        if records is not None and r.analysis:
            self.store.update_metadata(calibration=calibrate_devices(
                r.devices, model_dtypes(records.calls), self.timer, self._harness,
                self.store.meta.calibration, self.progress.describe))
        self.progress.start(self.eta.remaining_seconds)
        for batch in batches:
            for device in r.devices:
                self._run_cell_group(device, batch, first if (device is r.devices[0] and batch == batches[0]) else None)
                first = None
                headroom.release(device, self.activation_bytes_per_sample * batch * (3 if r.training else 1))
        searched = any(c.get("tries") for c in self.store.meta.capacity.values())
        if self.saved and ("capacity" not in self.store.metadata or (r.capacity and not searched)):
            # Fitted from every finished cell, a resumed run's earlier ones included.
            rows_so_far = list(getattr(self.store, "resumed_rows", [])) + self.saved
            self.store.update_metadata(capacity=all_capacities(r, rows_so_far, headroom.memory_limit_bytes,
                                                               self.progress.describe))
            self.progress.advance("every cell measured", 0.0)
        self.progress.finish()

    def _run_cell_group(self, device: Device, batch: int, captured: tuple | None) -> None:
        r = self.request
        keys = [CellKey.of("layer", layer.name, device.name, batch, r.mode) for layer in self.store.layers]
        model_key = CellKey.of("model", MODEL_LAYER, device.name, batch, r.mode)
        if keys and all(self.store.is_done(k) for k in keys + [model_key]):
            return
        if self.should_stop():
            raise Interrupted()
        self.eta.revise()
        self.progress.describe(f"capturing inputs on {device.name} @ batch {batch}")
        if captured is None and self.first_oom is not None:
            self._failed_cells(device, batch, self.first_oom)
            self.first_oom = None
            return
        if captured is None:
            shortfall = headroom.host_shortfall(device, self.activation_bytes_per_sample, batch)
            if shortfall and not r.training:  # a training group keeps every activation for its backward
                self._run_in_parts(device, batch, shortfall)
                return
            if shortfall:
                self._failed_cells(device, batch, MemoryError(shortfall))
                return
            try:
                captured = self._capture(device, batch)
            except Interrupted:
                raise
            except Exception as exc:
                self._failed_cells(device, batch, exc)
                return
        cap, inputs, copy_seconds, input_bytes = captured
        record_structure(self.store, cap, batch, self._training_setup)
        self._measure_group(device, batch, cap, inputs, copy_seconds, input_bytes, model_key)

    def _pending_cells(self, device: Device, batch: int, cap: Capture, inputs: Any, copy_seconds: float,
                       input_bytes: int, model_key: tuple) -> dict[tuple, Cell]:
        """The unmeasured cells of (batch, device), each with its programs and its row builder."""
        r = self.request
        cells = self._cells(device, cap, inputs)
        pending: dict[tuple, Cell] = {}
        for call in cap.calls:
            key = CellKey.of("layer", call.name, device.name, batch, r.mode)
            if not self.store.is_done(key):
                base = dict(self._base_row(device, batch), layer=call.name, layer_type=call.type,
                            category=call.category)
                pending[key] = cells.layer(call, f"{call.name} on {device.name} @ batch {batch}", base)
        if isinstance(cells, TrainingCells):
            record_skipped(self.store, cells.skipped.values())
            for skip in cells.split_activations:
                key = CellKey.of("layer", skip.row_name, device.name, batch, r.mode)
                if not self.store.is_done(key):
                    base = dict(self._base_row(device, batch), layer=skip.row_name, layer_type=skip.activation_name,
                                category="activation")
                    pending[key] = cells.activation(skip, f"{skip.row_name} on {device.name} @ batch {batch}", base)
        loss_key = CellKey.of("layer", LOSS_LAYER, device.name, batch, r.mode)
        if isinstance(cells, TrainingCells) and not self.store.is_done(loss_key):
            base = dict(self._base_row(device, batch), layer=LOSS_LAYER, layer_type=r.training_setup.loss_name,
                        category="loss")
            pending[loss_key] = cells.loss(f"the loss on {device.name} @ batch {batch}", base)
        if not self.store.is_done(model_key):
            label = f"whole {'train step' if r.training else 'model'} on {device.name} @ batch {batch}"
            pending[model_key] = cells.step(label, self._base_row(device, batch), copy_seconds, input_bytes)
        return pending

    def _cells(self, device: Device, cap: Capture, inputs: Any) -> InferenceCells | TrainingCells:
        r = self.request
        common = (r.model_on(device), r.xla)
        if r.training:
            return TrainingCells(device, r.training_setup, cap, inputs, *common, r.seed, r.config.confidence,
                                 r.tensors_fn, r.rebuild_fn)
        return InferenceCells(device, cap, inputs, *common, r.config.confidence, r.tensors_fn, r.rebuild_fn)

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
