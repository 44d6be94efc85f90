"""The model's structure in the profile: every leaf call's record and the layer graph, written once.

The first capture writes the layer records and each batch size's edges. A training profile's
records also say which layers train, which input gradients a real backward computes and which
call owns a shared layer's variables, and gain the loss's own record; the layers a compiled
train step never runs are marked as they are found (``record_skipped``).
"""

from __future__ import annotations

from typing import Any, Iterable

from tbs.capture.recorder import Capture
from tbs.load.train_setup import TrainingSetup
from tbs.measure.request import CellSink
from tbs.measure.skipped import SkippedActivation
from tbs.measure.train_cells import gradient_plan, structure as training_structure
from tbs.schema import LayerRecord


def record_structure(store: CellSink, captured: Capture, batch: int, training: TrainingSetup | None) -> None:
    """The layer records (first capture only) and the graph at ``batch`` (edges with ``grad`` in training)."""
    if not store.meta.layers:
        store.set_layers([call.replace(batch_size=batch) for call in captured.calls])
    graph = store.metadata.setdefault("graph", {})
    if str(batch) not in graph:
        graph[str(batch)] = (_training_structure(store, captured, training) if training is not None
                             else [vars(e) for e in captured.edges])
    store.update_metadata()


def _training_structure(store: CellSink, captured: Capture, setup: TrainingSetup) -> list[dict[str, Any]]:
    """Add what training needs to the layer records (trainable, input gradients, the loss's record); the edges."""
    changes, loss, edges = training_structure(captured, gradient_plan(captured.calls), setup)
    records = [r.replace(**changes.get(r.name, {})) for r in store.layers]
    if loss.name not in {r.name for r in records}:
        records.append(loss)
    store.set_layers(records)
    return edges


def record_skipped(store: CellSink, skipped: Iterable[SkippedActivation]) -> None:
    """Mark the layers the compiled step does not run, and add the activations timed apart, after their layer."""
    records = store.layers
    names = [r.name for r in records]
    changed = False
    for skip in skipped:
        if skip.call.name not in names:
            continue
        at = names.index(skip.call.name)
        if skip.whole_layer and records[at].in_step is not False:
            records[at] = records[at].replace(in_step=False)
            changed = True
        elif not skip.whole_layer and skip.row_name not in names:
            records.insert(at + 1, LayerRecord(name=skip.row_name, type=skip.activation_name, category="activation",
                                               trainable=False, grad_inputs=[False], in_step=False,
                                               part_of=skip.call.name))
            names.insert(at + 1, skip.row_name)
            changed = True
    if changed:
        store.set_layers(records)
