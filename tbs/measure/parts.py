"""A (batch, device) group whose eager capture would not fit in the host's memory, measured in parts.

The profiler's half for such a group (``held`` sizes the parts): the whole model alone, then the
layers a part at a time, each part's inputs made by one compiled pass (``capture.compiled``) and
freed before the next. A cell that fits in no part is recorded out of memory with the compiler's
analysis of its program on shapes alone, so ``tbs predict`` still has its FLOPs, bytes and memory.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np

from tbs.backends.base import Device
from tbs.backends.tensors import tensor_bytes
from tbs.capture import compiled
from tbs.capture.recorder import Capture, LayerCall
from tbs.load.inputs import structure_inputs
from tbs.measure import analysis, headroom, held, rows, transfers
from tbs.measure.dedupe import call_signature
from tbs.measure.capacity import HOST_MARGIN, call_at, search
from tbs.measure.inference import invoker
from tbs.measure.structure import record_structure
from tbs.measure.timing import Interrupted
from tbs.schema import MEASURED, MODEL_LAYER, CellKey, Status


class InParts:
    """Mixed into ``Profiler``: it lends ``request``, ``store``, ``timer``, ``saved``, ``costs``, ``analysed``,
    ``progress`` and its ``_save``, ``_base_row``, ``_failed_cells`` and ``_measure_group``."""

    def _first_too_big(self, device: Device, batch: int) -> tuple[Capture, int] | None:
        """The first batch's call records and input bytes, traced on shapes alone, where one eager capture
        of it would not fit in the host's memory (None where it would, or where this cannot be told):
        the first capture is then not made, and its group goes the way of any other too large."""
        r = self.request
        if device.kind != "cpu" or headroom.memory_headroom_bytes() is None:
            return None
        model = r.model_on(device)
        if not getattr(model, "built", False):  # a trace must not be where its weights are first made
            return None
        try:
            inputs = device.place(structure_inputs(model, r.host_inputs(batch), r.specs))
            traced = compiled.records(model, inputs, device, r.tensors_fn, r.rebuild_fn)
        except Exception:  # a model that does not trace: its eager capture decides, as before
            return None
        if traced is None:
            return None
        input_bytes = sum(tensor_bytes(x) for x in r.tensors_fn(inputs))
        per_sample = (sum(c.output_bytes for c in traced.capture.calls) + input_bytes) / batch
        return (traced.capture, input_bytes) if headroom.host_shortfall(device, per_sample, batch) else None

    def _run_in_parts(self, device: Device, batch: int, shortfall: str) -> None:
        """An inference group whose eager capture would not fit: sampled a part at a time (``held``).

        The whole model first, alone; then the layers, each part's inputs from one compiled pass.
        A cell that fits in no part is recorded out of memory with the compiler's analysis of it.
        """
        r = self.request
        model = r.model_on(device)
        try:
            host_inputs = structure_inputs(model, r.host_inputs(batch), r.specs)
            copy_seconds = float(np.median(transfers.timed_copies(device, host_inputs, clock=self.timer.clock)))
            inputs = device.place(host_inputs)
            traced = compiled.records(model, inputs, device, r.tensors_fn, r.rebuild_fn)
        except Interrupted:
            raise
        except Exception as exc:
            self._failed_cells(device, batch, exc)
            return
        if traced is None:  # this backend cannot trace: the eager capture's estimate decides, as before
            self._failed_cells(device, batch, MemoryError(shortfall))
            return
        record_structure(self.store, traced.capture, batch, None)
        input_bytes = sum(tensor_bytes(x) for x in r.tensors_fn(inputs))
        free = headroom.memory_headroom_bytes() or 0.0
        temps, model_per_sample = held.compiler_figures(list(getattr(self.store, "resumed_rows", [])) + self.saved,
                                                        device.name, batch)
        calls = {c.name: c for c in traced.capture.calls}
        keys = {name: CellKey.of("layer", name, device.name, batch, r.mode) for name in calls}
        parts = held.plan({n: held.layer_need(c, batch, temps.get(n)) for n, c in calls.items()
                           if not self.store.is_done(keys[n])}, free)
        model_key = CellKey.of("model", MODEL_LAYER, device.name, batch, r.mode)
        if not self.store.is_done(model_key):
            self._whole_model_alone(device, batch, model, inputs, traced, copy_seconds, input_bytes,
                                    held.model_need(batch, model_per_sample), free)
        for name, need in parts.too_big.items():
            call = calls[name]
            base = dict(self._base_row(device, batch), layer=name, layer_type=call.type, category=call.category)
            self._untimed(keys[name], base, held.shortfall_reason(name, batch, need, free), call, lambda call=call: {
                analysis.FORWARD: device.program_cost(invoker(call, r.rebuild_fn), traced.specs[call.name], r.xla,
                                                      getattr(call.op, "variables", ()))})
        for names in parts.parts:
            self.progress.describe(f"capturing {len(names)} layers' inputs on {device.name} @ batch {batch}")
            try:
                cap = compiled.part(model, inputs, device, traced, set(names), r.tensors_fn, r.rebuild_fn)
            except Interrupted:
                raise
            except Exception as exc:  # this part's cells get the reason; the next part is tried
                for name in names:
                    base = dict(self._base_row(device, batch), layer=name, layer_type=calls[name].type,
                                category=calls[name].category)
                    self._save(keys[name], rows.failed_row(base, exc), [], name)
                continue
            self._measure_group(device, batch, cap, inputs, copy_seconds, input_bytes, model_key)
            del cap
            gc.collect()  # this part's inputs go before the next part's are made
        self.store.metadata.setdefault("sampled_in_chunks", {})[f"{device.name}@{batch}"] = len(parts.parts)
        self.store.update_metadata()

    def _whole_model_alone(self, device: Device, batch: int, model: Any, inputs: Any, traced: Any,
                           copy_seconds: float, input_bytes: int, need: held.Need | None, free: float) -> None:
        """The whole model at a batch sampled in parts: timed alone where its compiled memory fits, tried
        by the largest-batch search's guarded real calls where that is not known or close, else refused."""
        r = self.request
        model_key = CellKey.of("model", MODEL_LAYER, device.name, batch, r.mode)
        too_big = need is not None and need.total > held.ALONE_SHARE * free
        reason = held.shortfall_reason("the whole model", batch, need, free) if too_big else ""
        if not too_big and (need is None or need.total > held.PART_SHARE * free):
            ran = [int(k.batch_size) for k, row in self.saved if k.target == "model" and k.device == device.name
                   and row.get("status") in MEASURED]
            found = search(call_at(r, device), device, max(ran, default=1), HOST_MARGIN * free, None, batch)
            reason = "" if found["confirmed_batch"] == batch else (
                f"out of memory: real calls (each at most 2x a batch whose peak was measured) reached batch "
                f"{found['confirmed_batch']} within {free / 2**30:.1f} GiB available"
                + (f"; {found['reason']}" if found["reason"] else ""))
        if not reason:
            self._measure_group(device, batch, Capture([], traced.capture.edges, None), inputs, copy_seconds,
                                input_bytes, model_key)
            return

        def forward(*tensors: Any) -> Any:
            return model(r.rebuild_fn(inputs, list(tensors)), training=False)

        def analyse() -> dict[str, Any]:
            stand_ins = [device.abstract(x) for x in r.tensors_fn(inputs)]
            return {analysis.FORWARD: device.program_cost(forward, stand_ins, r.xla, model.variables)}

        self._untimed(model_key, self._base_row(device, batch), reason, None, analyse)

    def _untimed(self, key: CellKey, base: dict[str, Any], reason: str, call: LayerCall | None,
                 analyse: Callable[[], dict[str, Any]]) -> None:
        """A cell the machine cannot hold: out of memory, with the compiler's analysis of its program
        on shapes alone (what ``tbs predict`` needs for a larger device at this batch)."""
        if self.request.analysis:
            signature = call_signature(call, key.device, "inference") if self.request.dedupe else None
            self.costs[key] = analysis.analysed(analyse, call, analysis.FORWARD, self.analysed, signature)
        self._save(key, dict(base, status=Status.OOM.value, reason=reason), [], f"{key.layer} out of memory")
