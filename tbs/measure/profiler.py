"""Measure every cell: each leaf layer, and the whole model, on each device and batch size.

Order: batch sizes ascending, then devices. For each (batch, device) the model
input is copied to the device (timed: a fixed cost), one eager pass captures every
layer's real arguments, then each layer and the whole compiled forward pass are
timed the same blocked, amortised way. Each finished cell goes straight to disk.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from tbs.backends.base import Device
from tbs.backends.tensors import tensor_bytes
from tbs.capture.recorder import Capture
from tbs.errors import TbsError
from tbs.load.inputs import structure_inputs
from tbs.load.train_setup import fit_to_outputs
from tbs.measure import headroom, rows, transfers
from tbs.measure.calibrate import calibrate_devices, model_dtypes
from tbs.measure.capacity import all_capacities
from tbs.measure.eta import WorkEstimate
from tbs.measure.inference import InferenceCells
from tbs.measure.parts import InParts
from tbs.measure.request import CellSink, ProfileRequest, Progress
from tbs.measure.rows import Cell
from tbs.measure.sampling import GroupSampling
from tbs.measure.saving import CellSaving
from tbs.measure.structure import record_skipped, record_structure
from tbs.measure.timing import Interrupted, Runner, Timer
from tbs.measure.train_cells import TrainingCells
from tbs.schema import LOSS_LAYER, MODEL_LAYER, CellKey, Status


class Profiler(InParts, GroupSampling, CellSaving):
    """One run's cells: plans what is left (resume), captures each (batch, device) group and hands it to the
    cell loop (``sampling``), which saves each finished cell (``saving``); a group too big for memory goes in parts."""

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
